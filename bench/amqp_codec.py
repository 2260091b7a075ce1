"""Micro-benchmark: encode and decode of one message transfer frame, shardbus vs the azure-servicebus SDK.

The frame is what a Service Bus client sends for a typical small message (~231 bytes on the wire): a
``transfer`` performative followed by a message with properties (message-id, content-type, group-id),
message-annotations, three application properties and a short data body.

    encode = build the message sections + the transfer performative + the 8-byte frame header
    decode = split header, decode the performative, decode every message section

Both codecs are measured in the same process on identical input; the ratio is SDK time / our time.
Run: .venv/bin/python bench/amqp_codec.py
"""

from __future__ import annotations

import struct
import sys
import timeit
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's shardbus

from shardbus.amqp.framing import FRAME_AMQP, encode_frame
from shardbus.amqp.message import AmqpMessage, Properties, decode_message
from shardbus.amqp.performatives import Transfer, decode_performative
from shardbus.amqp.types import Symbol

MESSAGE_ID = str(uuid.UUID(int=0x1234567890ABCDEF))
BODY = b"x" * 35
APP_PROPS = {"tenant": "contoso", "priority": 5, "kind": "order-created"}
TAG = b"\x00\x00\x00\x01"


def ours_encode() -> bytes:
    msg = AmqpMessage(
        message_annotations={Symbol("x-opt-partition-key"): "pk-1"},
        properties=Properties(message_id=MESSAGE_ID, content_type=Symbol("application/json"), group_id="pk-1"),
        application_properties=APP_PROPS,
        body=[BODY],
        body_type=1,  # type: ignore[arg-type]
    )
    payload = msg.encode()
    perf = Transfer(handle=1, delivery_id=7, delivery_tag=TAG, message_format=0, settled=False).encode()
    return encode_frame(FRAME_AMQP, 1, perf + payload)


def ours_decode(frame: bytes) -> AmqpMessage:
    size, doff, _, _ = struct.unpack_from(">IBBH", frame)
    body = frame[doff * 4 : size]
    _perf, offset = decode_performative(body)
    return decode_message(body[offset:])


def sdk_functions():  # type: ignore[no-untyped-def]
    from azure.servicebus._pyamqp._decode import decode_frame, decode_payload
    from azure.servicebus._pyamqp._encode import encode_frame as sdk_encode_frame
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._pyamqp.message import Message
    from azure.servicebus._pyamqp.message import Properties as SdkProperties
    from azure.servicebus._pyamqp.performatives import TransferFrame

    def sdk_encode() -> bytes:
        msg = Message(
            message_annotations={"x-opt-partition-key": "pk-1"},
            properties=SdkProperties(message_id=MESSAGE_ID, content_type="application/json", group_id="pk-1"),
            application_properties=APP_PROPS,
            data=[BODY],
        )
        payload = encode_payload(bytearray(), msg)
        frame = TransferFrame(
            handle=1, delivery_id=7, delivery_tag=TAG, message_format=0, settled=False, payload=payload
        )
        header, body = sdk_encode_frame(frame)
        return bytes(header + struct.pack(">H", 1) + body)  # as the SDK transport's send_frame does

    def sdk_decode(frame: bytes):  # type: ignore[no-untyped-def]
        view = memoryview(frame)
        size, doff, _, _ = struct.unpack_from(">IBBH", frame)
        _, fields = decode_frame(view[doff * 4 : size])
        return decode_payload(fields[-1])

    return sdk_encode, sdk_decode


def per_call_us(fn, *args, number: int = 20000, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    best = min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeat))
    return best / number * 1e6


def main() -> None:
    frame = ours_encode()
    sdk_encode, sdk_decode = sdk_functions()
    sdk_frame = sdk_encode()
    # cross-check: both sides read each other's frame
    assert ours_decode(sdk_frame).data == BODY
    assert sdk_decode(frame).data == [BODY]

    results = {
        "encode": (per_call_us(ours_encode), per_call_us(sdk_encode)),
        "decode": (per_call_us(ours_decode, frame), per_call_us(sdk_decode, sdk_frame)),
    }
    print(f"transfer frame: ours {len(frame)} bytes, SDK {len(sdk_frame)} bytes")
    print(f"{'op':<8}{'shardbus µs':>14}{'SDK µs':>12}{'SDK/ours':>11}")
    for op, (ours, sdk) in results.items():
        print(f"{op:<8}{ours:>14.2f}{sdk:>12.2f}{sdk / ours:>10.2f}x")


if __name__ == "__main__":
    main()
