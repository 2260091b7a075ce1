"""Session receive throughput over 16 partitions with 1, 10 and 100 concurrent sessions (Python API).

For each session count S, a partitioned session-enabled queue gets N messages spread evenly over S sessions;
then W receiver threads (W = min(S, 8)) repeatedly accept the next available session, drain it in batches
(peek-lock + complete) and give it back, until everything is consumed. Printed: messages/s and sessions/s, and the
ratio to the 1-session run measured in the same run (how well concurrency across sessions and partitions pays).

    python bench/sessions.py [--messages N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import shardbus
from shardbus import Message

BODY = os.urandom(1024)
BATCH = 100


def run(data: Path, sessions: int, messages: int) -> tuple[float, int]:
    with shardbus.Namespace.open(data / f"s{sessions}") as ns:
        ns.create_queue("q", enable_partitioning=True, requires_session=True)
        per = messages // sessions
        pending = []
        for s in range(sessions):
            for start in range(0, per, BATCH):
                n = min(BATCH, per - start)
                pending.append(ns.submit_send("q", [Message(BODY, session_id=f"session-{s}") for _ in range(n)]))
        for f in pending:
            f.result()
        total = per * sessions
        received = [0]
        lock = threading.Lock()
        accepted = [0]

        def worker() -> None:
            while True:
                with lock:
                    if received[0] >= total:
                        return
                try:
                    session = ns.session_receiver("q", max_wait=0.2)
                except shardbus.OperationTimeout:
                    continue
                with session:
                    with lock:
                        accepted[0] += 1
                    while batch := session.receive(BATCH, max_wait=0):
                        session.complete(*batch)
                        with lock:
                            received[0] += len(batch)

        threads = [threading.Thread(target=worker) for _ in range(min(sessions, 8))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        return total / elapsed, accepted[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="shardbus-bench-sessions-"))
    try:
        baseline = None
        for sessions in (1, 10, 100):
            rate, accepted = run(folder, sessions, args.messages)
            baseline = baseline or rate
            print(
                f"session-receive sessions={sessions} partitions=16 workers={min(sessions, 8)} "
                f"{rate:,.0f} msg/s sessions_accepted={accepted} ratio={rate / baseline:.2f}"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
