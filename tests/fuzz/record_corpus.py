"""Record the fuzz corpus: the bytes the official SDK sends in four sessions (a queue sender with a batch and a
scheduled message, a peek-lock receiver completing, abandoning, dead-lettering and peeking, a session sender, a
session receiver with session state), captured through a proxy in front of a broker.

    .venv/bin/python tests/fuzz/record_corpus.py tests/fuzz/corpus

The tokens in them expire an hour later; fuzz_wire.resign replaces them when the tests load the corpus.
"""

import pathlib
import socket
import sys
import tempfile
import threading
import time

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from shardbus.server import Broker

b = Broker(data_dir=tempfile.mkdtemp(), port=0).start()
ns = b.namespace
for q in ("fuzzq", "fuzzs"):
    try:
        ns.create_queue(q, requires_session=(q == "fuzzs"))
    except Exception:
        pass
captured = []


def proxy_server(lsock):
    while True:
        c, _ = lsock.accept()
        up = socket.create_connection(("127.0.0.1", b.server.port))
        buf = bytearray()
        captured.append(buf)

        def pipe(src, dst, rec):
            try:
                while d := src.recv(65536):
                    if rec is not None:
                        rec += d
                    dst.sendall(d)
            except OSError:
                pass
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=pipe, args=(c, up, buf), daemon=True).start()
        threading.Thread(target=pipe, args=(up, c, None), daemon=True).start()


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen()
port = ls.getsockname()[1]
threading.Thread(target=proxy_server, args=(ls,), daemon=True).start()
cs = f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
    with client.get_queue_sender("fuzzq") as s:
        s.send_messages(ServiceBusMessage("hello", application_properties={"a": 1}, message_id="m1"))
        s.send_messages([ServiceBusMessage("b1"), ServiceBusMessage("b2")])
        s.schedule_messages(
            ServiceBusMessage("later"), __import__("datetime").datetime.now(__import__("datetime").timezone.utc)
        )
    with client.get_queue_receiver("fuzzq") as r:
        ms = r.receive_messages(max_message_count=3, max_wait_time=2)
        for m in ms[:1]:
            r.complete_message(m)
        for m in ms[1:2]:
            r.abandon_message(m)
        for m in ms[2:]:
            r.dead_letter_message(m, reason="x")
        r.peek_messages(5)
    with client.get_queue_sender("fuzzs") as s:
        s.send_messages(ServiceBusMessage("s", session_id="S1"))
    with client.get_queue_receiver("fuzzs", session_id="S1") as r:
        r.session.set_state(b"st")
        r.session.get_state()
        for m in r.receive_messages(max_wait_time=2):
            r.complete_message(m)
time.sleep(1)
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
names = ["sdk_queue_sender", "sdk_queue_receiver", "sdk_session_sender", "sdk_session_receiver"]
for name, buf in zip(names, captured, strict=True):
    (out / f"{name}.bin").write_bytes(bytes(buf))
    print(name, len(buf))
b.stop()
