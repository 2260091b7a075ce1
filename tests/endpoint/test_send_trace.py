"""``SHARDBUS_STALL_TRACE_SENDS=1`` (stalltrace.py): a real ``shardbus serve`` notes every group of sends' life,
from its read to the dispositions' write, one ``send`` line each, and the stages come in the order they happen
(bench/pace.py prints them per stage). Sends from the official SDK over a real socket."""

from __future__ import annotations

import json
import os
import time

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from serve_process import ServeProcess

STAGES = ("arrived", "read", "flushed", "picked", "stored", "resolved", "loop", "acked", "written")


def test_every_send_is_traced_through_its_stages_in_order(tmp_path):
    config = tmp_path / "Config.json"
    namespace = {"Name": "sbemulatorns", "Queues": [{"Name": "q", "Properties": {"EnablePartitioning": True}}]}
    config.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "Console"}}}))
    trace = tmp_path / "stall.trace"
    env = dict(os.environ, SHARDBUS_STALL_TRACE=str(trace), SHARDBUS_STALL_TRACE_MS="0")
    env["SHARDBUS_STALL_TRACE_SENDS"] = "1"
    args = ["--port", "0", "--data-dir", str(tmp_path / "data"), "--config", str(config)]
    serve = ServeProcess(args, tmp_path / "serve.txt", env=env).wait_ready(60)
    try:
        with ServiceBusClient.from_connection_string(serve.connection_string, retry_total=0) as client:
            with client.get_queue_sender("q") as sender:
                for i in range(12):
                    sender.send_messages(ServiceBusMessage(f"m{i}"))
                sender.send_messages([ServiceBusMessage(f"b{i}") for i in range(5)])  # one transfer, one send
            time.sleep(1.5)  # the trace is flushed about every second (the loop probe's lines keep it going)
            lines = [line.split() for line in trace.read_text().splitlines()]
    finally:
        serve.stop()
    sends = [dict(f.split("=") for f in parts[3:]) for parts in lines if parts[2] == "send"]
    assert sum(int(s["n"]) for s in sends) == 13
    for s in sends:
        t = {k: float(v) for k, v in s.items()}
        t["flushed"] = 0.0
        times = [t[k] for k in STAGES]
        assert times == sorted(times), s
        assert t["queued"] == -1 or 0 <= t["queued"] <= t["picked"], s
        assert 0 <= t["cpu"] <= t["stored"] - t["picked"] + 0.5, s  # ms of the commit thread's CPU (clock ticks)
