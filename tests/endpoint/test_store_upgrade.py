"""A data directory written before the SQLite store kept the next sequence number in its counts table (in the meta
table, as main's code at 78397b8 wrote it) opens, and ``shardbus serve`` goes on numbering after what it gave out:
through a real process and the official SDK.

The old layout is made from a new one: every partition's file gets its number moved back into the meta table.
The queue is emptied first, so the number is all that remembers the sequence numbers given out (no row is left
to find them by)."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage

import shardbus
from serve_process import ServeProcess
from shardbus.store.sqlite import NEXT_SEQ, NEXT_SEQ_SLOT


def _serve(tmp_path: Path, data: Path) -> ServeProcess:
    return ServeProcess(
        ["--port", "0", "--data-dir", str(data)], tmp_path / f"stderr-{time.monotonic_ns()}.txt", cwd=tmp_path
    ).wait_ready()


def _send_and_complete(conn_str: str, bodies: list[str]) -> list[int]:
    """Send ``bodies`` (one partition), receive and complete them all; their sequence numbers."""
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(b, partition_key="k") for b in bodies])
        got = []
        with client.get_queue_receiver("orders") as receiver:
            deadline = time.monotonic() + 10
            while len(got) < len(bodies) and time.monotonic() < deadline:
                for m in receiver.receive_messages(max_message_count=len(bodies), max_wait_time=1):
                    receiver.complete_message(m)
                    got.append(m)
    assert sorted(str(m) for m in got) == sorted(bodies)
    return [m.sequence_number for m in got]


def _to_the_old_layout(data: Path) -> int:
    """Move every partition file's next sequence number from its counts table to its meta table; how many had one."""
    moved = 0
    for path in data.rglob("*.db"):
        db = sqlite3.connect(path)
        try:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name='counts'").fetchone() is None:
                continue  # the catalog
            row = db.execute("SELECT n FROM counts WHERE slot=? AND queue=0", (NEXT_SEQ_SLOT,)).fetchone()
            if row is None:
                continue
            db.execute("DELETE FROM counts WHERE slot=?", (NEXT_SEQ_SLOT,))
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (NEXT_SEQ, row[0]))
            db.commit()
            moved += 1
        finally:
            db.close()
    return moved


def test_a_data_dir_of_the_earlier_layout_keeps_numbering_after_a_restart(tmp_path):
    data = tmp_path / "data"
    with shardbus.Namespace.open(data) as ns:
        ns.create_queue("orders", enable_partitioning=True)
    s = _serve(tmp_path, data)
    first = _send_and_complete(s.connection_string, [f"a{i}" for i in range(5)])
    assert s.stop(signal.SIGTERM) == 0, s.stderr
    assert _to_the_old_layout(data) >= 1

    again = _serve(tmp_path, data)
    try:
        second = _send_and_complete(again.connection_string, [f"b{i}" for i in range(5)])
    finally:
        assert again.stop(signal.SIGTERM) == 0, again.stderr
    assert min(second) > max(first)  # the same partition (one key): numbered on from where it stopped

    third_run = _serve(tmp_path, data)  # and once more, now from the number the new layout keeps
    try:
        third = _send_and_complete(third_run.connection_string, [f"c{i}" for i in range(5)])
    finally:
        assert third_run.stop(signal.SIGTERM) == 0, third_run.stderr
    assert min(third) > max(second)
