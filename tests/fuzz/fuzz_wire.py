"""What every fuzz test shares (the fixtures are in ``conftest.py``): the recorded SDK sessions' folder
(``corpus/``, made by ``record_corpus.py``), a frame splitter, a reader of what the broker answered, and the check
that follows every input: a well-behaved client is still served. A module of its own, not ``conftest``: test
modules import it by name, and every test folder has a ``conftest``.

The recorded sessions carry SAS tokens that expired an hour after recording; ``resign`` puts a fresh token signed
with the test broker's key in their place, so a replay reaches as far into the broker as the SDK did.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from pathlib import Path
from urllib.parse import unquote_plus

from shardbus.access import sas
from shardbus.amqp.framing import FrameReader
from shardbus.amqp.message import AmqpMessage, decode_message
from shardbus.amqp.performatives import Accepted, Close, Detach, End, Transfer, decode_performative
from shardbus.amqp.transport import AmqpClient

CORPUS = Path(__file__).parent / "corpus"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
KEY_NAME = "RootManageSharedAccessKey"
KEY = "SAS_KEY_VALUE"

# Conditions a broker may close, end or detach with: the AMQP 1.0 spec's (2.8.15-2.8.18) and the ones Service Bus
# refuses links with. Anything else would be a condition we made up.
CONDITIONS = {
    f"amqp:{c}"
    for c in [
        "internal-error",
        "not-found",
        "unauthorized-access",
        "decode-error",
        "resource-limit-exceeded",
        "not-allowed",
        "invalid-field",
        "not-implemented",
        "resource-locked",
        "precondition-failed",
        "resource-deleted",
        "illegal-state",
        "frame-size-too-small",
        "connection:forced",
        "connection:framing-error",
        "connection:redirect",
        "session:window-violation",
        "session:errant-link",
        "session:handle-in-use",
        "session:unattached-handle",
        "link:detach-forced",
        "link:transfer-limit-exceeded",
        "link:message-size-exceeded",
        "link:redirect",
        "link:stolen",
    ]
} | {
    "com.microsoft:argument-error",
    "com.microsoft:argument-out-of-range",
    "com.microsoft:entity-disabled",
    "com.microsoft:session-cannot-be-locked",
    "com.microsoft:timeout",
    "com.microsoft:server-busy",
}


def split_frames(stream: bytes) -> list[bytes]:
    """Protocol headers and frames, in order (a truncated tail is kept as it is)."""
    parts: list[bytes] = []
    p = 0
    while p < len(stream):
        if stream[p : p + 4] == b"AMQP":
            parts.append(stream[p : p + 8])
            p += 8
            continue
        size = struct.unpack_from(">I", stream, p)[0] if len(stream) - p >= 4 else len(stream) - p
        size = max(size, 1)
        parts.append(stream[p : p + size])
        p += size
    return parts


def resign(stream: bytes, key: str = KEY) -> bytes:
    """The stream with every put-token's SAS token replaced by a fresh one for the same resource and key name."""
    out = []
    for part in split_frames(stream):
        if b"SharedAccessSignature" in part and part[:4] != b"AMQP":
            doff = part[4] * 4
            perf, offset = decode_performative(part[doff:])
            message = decode_message(part[doff + offset :])
            token = message.body.decode() if isinstance(message.body, bytes) else str(message.body)
            fields = dict(pair.split("=", 1) for pair in token[len(sas.PREFIX) :].split("&"))
            fresh = sas.generate_token(unquote_plus(fields["sr"]), unquote_plus(fields["skn"]), key)
            message.body = fresh
            body = perf.encode() + message.encode()
            part = struct.pack(">IBBH", 8 + len(body), 2, part[5], struct.unpack_from(">H", part, 6)[0]) + body
        out.append(part)
    return b"".join(out)


def exchange(port: int, parts: list[bytes], pause: float = 0.0, limit: float = 5.0) -> bytes:
    """Send ``parts`` (all at once, or one by one ``pause`` seconds apart, reading what comes meanwhile), then
    shut our side and read until the broker closes. Fails if it does not close within ``limit`` seconds."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        try:
            if pause:
                sock.settimeout(pause)
                for part in parts:
                    sock.sendall(part)
                    try:
                        received += sock.recv(1 << 20)
                    except TimeoutError:
                        pass
            else:
                sock.sendall(b"".join(parts))
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # reset, broken pipe, not connected
            pass  # the broker closed first: it may, after a violation
        sock.settimeout(limit)
        deadline = time.monotonic() + limit
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
                assert time.monotonic() < deadline, "the broker kept the connection open"
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError("the broker neither answered nor closed the connection") from None
    return bytes(received)


def answer_errors(data: bytes) -> list[tuple[str, str | None]]:
    """The (performative, condition) of every close, end and detach with an error the broker sent. The broker's
    own bytes must always parse: a decode failure here fails the test."""
    errors: list[tuple[str, str | None]] = []
    if data.startswith(b"HTTP/1.1 "):
        # A mutation made the first byte an HTTP method's first letter (``listener.HTTP_FIRST_BYTES``): the
        # listener took the connection for plain HTTP, which must refuse the bytes as a bad request.
        assert data[9:10] == b"4", f"garbage taken for HTTP was not refused: {data[:40]!r}"
        return errors
    reader = FrameReader()
    reader.feed(data)
    while reader.buffered:
        if reader.peek(4) == b"AMQP":
            reader.read_protocol_header()
            continue
        frame = reader.next_frame()
        if frame is None:
            raise AssertionError(f"the broker sent a truncated frame: {reader.peek(16)!r}")
        if not frame.body:
            continue
        perf, _ = decode_performative(frame.body)
        if isinstance(perf, Close | End | Detach) and perf.error is not None:
            errors.append((type(perf).__name__, str(perf.error.condition)))
        elif isinstance(perf, Transfer):
            continue
    return errors


def assert_proper_answers(data: bytes) -> None:
    for what, condition in answer_errors(data):
        assert condition in CONDITIONS, f"{what} with a condition the spec does not name: {condition}"


def still_serving(port: int) -> None:
    """A well-behaved client connects, sends to ``fuzzq`` and gets ``accepted``."""

    async def run() -> None:
        client = await AmqpClient.connect(
            "127.0.0.1", port, sasl_mechanism="PLAIN", username=KEY_NAME, password=KEY, timeout=10
        )
        try:
            session = await client.session()
            sender = await session.sender("fuzzq")
            outcome = await sender.send(AmqpMessage.with_data(b"still serving").encode())
            assert isinstance(outcome, Accepted), outcome
        finally:
            await client.close()

    asyncio.run(run())


def wait_for_no_connections(broker, limit: float = 10.0) -> None:
    """Every connection the test opened is gone from the broker (its state released)."""
    deadline = time.monotonic() + limit
    while broker.server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not broker.server.connections, f"{len(broker.server.connections)} connections left behind"
