"""Many idle connections: the broker's memory per idle connection, and another client's latency beside them.

A broker runs as a child process (``shardbus serve``, embedded partitions, durable SQLite stores). Holder processes
(``--processes``, each raising its own open-file limit with ``resource.setrlimit``) open ``--connections`` AMQP
connections between them, each with SASL PLAIN, a session and a sender link to a queue, then stay idle (our
engine answers the broker's idle time-out with empty frames, as the SDK's keep-alive does). A probe client sends a
message and receives it back (peek-lock, then accept), one round trip after the other, and records each one's time.

Printed:

    baseline   the probe's p50 / p99 / max round trip with no idle connections, and the broker's RSS
    opened     how long the idle connections took to open, and how many the broker counts
    loaded     the probe again, ``--rounds`` times with the idle connections held: p50 / p99 / max of each round,
               then the median p99 and its range; ``target met`` when the median p99 is under 50 ms
    memory     broker RSS with them held, and (RSS loaded - RSS baseline) / connections = bytes per idle connection

The probe's rounds interleave with nothing (the idle connections cannot be dropped and reopened between rounds
cheaply); the baseline and the loaded rounds are read together, from the same run.

    python bench/connections.py [--connections 10000] [--processes 4] [--probes 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = {"sasl_mechanism": "PLAIN", "username": "RootManageSharedAccessKey", "password": "SAS_KEY_VALUE"}
CONNECTION_STRING = re.compile(r"^connection string: Endpoint=sb://[^;]+:(\d+);")
TARGET_P99_MS = 50.0
QUEUES = [{"Name": "idle"}, {"Name": "probe"}]


def raise_file_limit(wanted: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# --- holders ------------------------------------------------------------------------------------------------------
def hold(port: int, count: int, ready: mp.Queue, stop: mp.Event) -> None:  # type: ignore[valid-type]
    """Child: open ``count`` idle connections (session + sender link each), report, hold them until ``stop``."""
    raise_file_limit(count + 256)
    from shardbus.amqp.transport import AmqpClient, install_uvloop

    install_uvloop()

    async def one(gate: asyncio.Semaphore) -> AmqpClient:
        async with gate:  # a bounded burst of handshakes: the listen backlog is finite
            client = await AmqpClient.connect("127.0.0.1", port, timeout=120, **PLAIN)
            session = await client.session()
            await session.sender("idle")
            return client

    async def main() -> None:
        gate = asyncio.Semaphore(100)
        results = await asyncio.gather(*(one(gate) for _ in range(count)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        ready.put((count - len(failed), repr(failed[0]) if failed else None))
        while not stop.is_set():
            await asyncio.sleep(0.2)

    asyncio.run(main())


# --- the probe ----------------------------------------------------------------------------------------------------
async def probe(port: int, count: int) -> list[float]:
    """``count`` send + receive round trips on one connection; each one's seconds."""
    from shardbus.amqp.message import AmqpMessage, Properties
    from shardbus.amqp.message import BodyType as WireBody
    from shardbus.amqp.performatives import Accepted
    from shardbus.amqp.transport import AmqpClient

    client = await AmqpClient.connect("127.0.0.1", port, timeout=30, **PLAIN)
    try:
        session = await client.session()
        sender = await session.sender("probe")
        receiver = await session.receiver("probe", credit=1)
        times = []
        for i in range(count):
            payload = AmqpMessage(
                properties=Properties(message_id=f"probe-{i}"), body=[b"x" * 256], body_type=WireBody.DATA
            ).encode()
            started = time.perf_counter()
            await sender.send(payload)
            delivery = await receiver.receive(timeout=30)
            receiver.settle(delivery, Accepted())
            receiver.grant(1)
            times.append(time.perf_counter() - started)
        return times
    finally:
        await client.close()


def summary(times: list[float]) -> tuple[float, float, float]:
    ordered = sorted(times)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return p50 * 1000, p99 * 1000, ordered[-1] * 1000


# --- the broker ---------------------------------------------------------------------------------------------------
def start_broker(data_dir: Path, connections: int) -> tuple[subprocess.Popen, int]:
    config = data_dir / "config.json"
    config.write_text(
        json.dumps(
            {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": [{"Name": "idle"}, {"Name": "probe"}]}]}}
        )
    )
    args = [sys.executable, "-m", "shardbus.cli", "serve", "--port", "0", "--data-dir", str(data_dir / "data")]
    args += ["--config", str(config), "--max-connections", str(connections + 100)]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = CONNECTION_STRING.match(line)
        if m:
            return proc, int(m.group(1))
    raise RuntimeError(f"the broker did not start (exit code {proc.wait()})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--probes", type=int, default=500, help="round trips per probe round")
    parser.add_argument("--rounds", type=int, default=3, help="probe rounds with the idle connections held")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardbus-connections-") as tmp:
        broker, port = start_broker(Path(tmp), args.connections)
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        holders: list = []
        try:
            time.sleep(1.0)
            asyncio.run(probe(port, 50))  # warm-up: imports, first entity use, SQLite caches
            base = summary(asyncio.run(probe(port, args.probes)))
            time.sleep(1.0)
            rss_base = rss_bytes(broker.pid)
            print(
                f"baseline   p50={base[0]:.2f} ms  p99={base[1]:.2f} ms  max={base[2]:.2f} ms  "
                f"broker_rss={rss_base / 2**20:.1f} MiB",
                flush=True,
            )

            ready = ctx.Queue()
            per = [
                args.connections // args.processes + (1 if i < args.connections % args.processes else 0)
                for i in range(args.processes)
            ]
            started = time.monotonic()
            for count in per:
                p = ctx.Process(target=hold, args=(port, count, ready, stop), daemon=True)
                p.start()
                holders.append(p)
            opened = 0
            errors = []
            for _ in per:
                n, error = ready.get(timeout=600)
                opened += n
                if error:
                    errors.append(error)
            took = time.monotonic() - started
            print(
                f"opened     {opened}/{args.connections} idle connections (a session and a sender link each) in "
                f"{took:.1f} s ({opened / took:.0f}/s)" + (f"; first failure: {errors[0]}" if errors else ""),
                flush=True,
            )
            time.sleep(2.0)

            p99s = []
            for r in range(args.rounds):
                s = summary(asyncio.run(probe(port, args.probes)))
                p99s.append(s[1])
                print(f"loaded     round {r + 1}: p50={s[0]:.2f} ms  p99={s[1]:.2f} ms  max={s[2]:.2f} ms", flush=True)
            median = statistics.median(p99s)
            verdict = "target met" if median < TARGET_P99_MS else "MISSED"
            print(
                f"loaded     p99 median={median:.2f} ms (range {min(p99s):.2f}-{max(p99s):.2f}) against "
                f"{base[1]:.2f} ms with no idle connections: {verdict} (< {TARGET_P99_MS:.0f} ms)",
                flush=True,
            )
            rss_loaded = rss_bytes(broker.pid)
            per_conn = (rss_loaded - rss_base) / max(opened, 1)
            print(
                f"memory     broker_rss={rss_loaded / 2**20:.1f} MiB with {opened} idle connections: "
                f"{per_conn / 1024:.1f} KiB per idle connection",
                flush=True,
            )
        finally:
            stop.set()
            for p in holders:
                p.join(30)
                if p.is_alive():
                    p.kill()
            broker.terminate()
            try:
                broker.wait(30)
            except subprocess.TimeoutExpired:
                broker.kill()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
