"""``decode_message`` alone, on the payloads it meets every message: this checkout against a base tree.

Payloads (built by this checkout's encoders, then handed to both trees as bytes, so both decode the same input):

  sdk-send        what the azure-servicebus SDK sends for a 1 KB message with a message-id, a partition key (a
                  message annotation) and three application properties (its own encoder's bytes)
  sdk-delivery    what the broker delivers of it to a peek-lock receiver: header, message-annotations (sequence
                  number, enqueued time, locked-until, partition key), the sender's properties and application
                  properties, the body (``endpoint.mapping.encode_delivery``)
  scale-delivery  what bench/scale.py's receivers get: our client's durable 1 KB message with a message-id, as
                  the broker delivers it (``encode_deliveries``: header, three annotations, properties, data)
  value-body      an amqp-value body (a map), with header and properties: the management replies' shape

Modes:
  --time      per-call µs (timeit, best of 5) in child processes, this tree and the base alternating for
              ``--rounds`` rounds; prints each payload's median and range and the median of the per-round ratios
  --callgrind instructions per call (valgrind callgrind: N calls minus 0 calls), this tree and the base

    python bench/decode_message.py --base /tmp/b93dbd64 [--time] [--callgrind] [--rounds 5]

Measured at 8831623 against 93dbd64 (--callgrind --calls 1000, instructions per call, this / base):
sdk-send 54,243 / 70,910 = 0.765; sdk-delivery 76,407 / 111,168 = 0.687; scale-delivery 48,326 / 78,582 = 0.615;
value-body 89,817 / 113,939 = 0.788. (--time swings by half on a shared 2-core machine: use the counts.)
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import timeit
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"
BODY = bytes(range(256)) * 4
MESSAGE_ID = str(uuid.UUID(int=0x1234567890ABCDEF))
APP_PROPS = {"tenant": "contoso", "priority": 5, "kind": "order-created"}


def payloads() -> dict[str, bytes]:
    """The payloads above, encoded by this checkout (and the SDK)."""
    sys.path.insert(0, str(SRC))
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._pyamqp.message import Message as SdkMessage
    from azure.servicebus._pyamqp.message import Properties as SdkProperties

    from shardbus.amqp.message import AmqpMessage, BodyType, Header, Properties
    from shardbus.client import OutgoingMessage
    from shardbus.endpoint.mapping import decode_to_message, encode_deliveries, encode_delivery

    sdk = bytes(
        encode_payload(
            bytearray(),
            SdkMessage(
                message_annotations={b"x-opt-partition-key": "pk-1"},
                properties=SdkProperties(message_id=MESSAGE_ID),
                application_properties=APP_PROPS,
                data=[BODY],
            ),
        )
    )

    def stamped(payload: bytes) -> object:
        m = decode_to_message(payload)
        m.sequence_number = 123456
        m.enqueued_time_ms = 1_790_000_000_000
        m.locked_until_ms = 1_790_000_060_000
        m.lock_token = uuid.UUID(int=7)
        m.delivery_count = 1
        return m

    ours = OutgoingMessage(BODY, message_id="r1b0-12345", durable=True).encode()
    value = AmqpMessage(
        header=Header(durable=True),
        properties=Properties(message_id="shardbus-1", correlation_id="shardbus-1", to="$management"),
        application_properties={"statusCode": 200, "statusDescription": "OK"},
        body={"sequence-numbers": [1, 2, 3], "lock-tokens": [uuid.UUID(int=1)], "expiration": 12},
        body_type=BodyType.VALUE,
    ).encode()
    return {
        "sdk-send": sdk,
        "sdk-delivery": encode_delivery(stamped(sdk)),  # type: ignore[arg-type]
        "scale-delivery": encode_deliveries([stamped(ours)])[0],  # type: ignore[list-item]
        "value-body": value,
    }


def child_time(src: str, file: str) -> None:
    """Print ``name µs`` per payload for the tree in ``src``."""
    sys.path.insert(0, src)
    from shardbus.amqp.message import decode_message

    for name, payload in pickle.loads(Path(file).read_bytes()).items():
        number = 20000
        best = min(timeit.repeat(lambda p=payload: decode_message(p), number=number, repeat=5))
        print(name, best / number * 1e6)


def child_calls(src: str, file: str, name: str, calls: int) -> None:
    """``calls`` decodes of one payload (callgrind counts this, and the same with 0 calls)."""
    sys.path.insert(0, src)
    from shardbus.amqp.message import decode_message

    payload = pickle.loads(Path(file).read_bytes())[name]
    decode_message(payload)  # warm caches (interned symbols) in both counts alike
    for _ in range(calls):
        decode_message(payload)


def _run_time(src: Path, file: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child-time", str(src), file], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}


def _instructions(src: Path, file: str, name: str, calls: int) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(HERE)]
    command += ["--child-calls", str(src), file, name, str(calls)]
    env = os.environ | {"PYTHONHASHSEED": "0"}  # dicts of the same keys probe alike in every run: a repeatable count
    err = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stderr
    match = re.search(r"Collected : (\d+)", err)
    if match is None:
        raise SystemExit(f"no count from callgrind:\n{err}")
    return int(match[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a base tree (its src/ is imported)")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child-time", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-calls", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_time:
        child_time(*args.child_time)
        return
    if args.child_calls:
        src, file, name, calls = args.child_calls
        child_calls(src, file, name, int(calls))
        return
    trees = {"this": SRC} | ({"base": args.base / "src"} if args.base else {})
    with tempfile.NamedTemporaryFile(prefix="decode-payloads-") as f:
        data = payloads()
        Path(f.name).write_bytes(pickle.dumps(data))
        for name, payload in data.items():
            print(f"{name}: {len(payload)} bytes")
        if args.callgrind:
            for name in data:
                per = {
                    label: (_instructions(src, f.name, name, args.calls) - _instructions(src, f.name, name, 0))
                    / args.calls
                    for label, src in trees.items()
                }
                line = f"callgrind {name:<15}" + "".join(f" {k} {v:,.0f}" for k, v in per.items())
                if "base" in per:
                    line += f"  ratio this/base {per['this'] / per['base']:.3f}"
                print(line, flush=True)
        if args.time:
            got: dict[str, dict[str, list[float]]] = {label: {} for label in trees}
            for r in range(args.rounds):
                order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
                for label, src in order:
                    for name, us in _run_time(src, f.name).items():
                        got[label].setdefault(name, []).append(us)
            for name in data:
                line = f"time {name:<15}"
                for label in trees:
                    xs = got[label][name]
                    line += f" {label} {statistics.median(xs):.2f} µs [{min(xs):.2f}-{max(xs):.2f}]"
                if "base" in got:
                    ratios = [a / b for a, b in zip(got["this"][name], got["base"][name], strict=True)]
                    line += f"  ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
                print(line, flush=True)


if __name__ == "__main__":
    main()
