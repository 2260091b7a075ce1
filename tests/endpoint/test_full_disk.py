"""A full disk, through the SDK over real sockets: a broker whose data directory is on a small file system of its
own (a 32 MB tmpfs, else a loop-mounted ext4 file), filled up by a file beside it.

While it is full, sends fail with ServiceBusServerBusyError saying the store is full, nothing acknowledged is lost,
and receives and completes of what is stored go on; once the file is removed, sends succeed again, without a
restart of the broker, and what was completed meanwhile is durably gone (checked by a restart at the very end).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusServerBusyError

from shardbus.model.errors import ServerBusy
from shardbus.server import Broker

WORKERS = int(os.environ.get("SHARDBUS_TEST_WORKERS", "0"))
BODY = b"x" * 1000
_names = itertools.count()


def _run(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def small_file_system(where: Path, size_mb: int = 32) -> Iterator[Path]:
    """A file system of ``size_mb`` mounted at ``where/mnt``: tmpfs, else ext4 in a loop-mounted file."""
    mnt = where / "mnt"
    mnt.mkdir()
    mounted = False
    if os.environ.get("SHARDBUS_TEST_SMALL_FS") != "ext4":  # ext4: try the loop-mounted file only
        mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt))
    if not mounted and shutil.which("mkfs.ext4"):
        image = where / "fs.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        mounted = _run("mkfs.ext4", "-q", "-F", str(image)) and _run("mount", "-o", "loop", str(image), str(mnt))
    if not mounted:
        reason = "cannot mount a small file system here (needs root: tmpfs or a loop device)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mnt
    finally:
        if not _run("umount", str(mnt)):
            _run("umount", "-l", str(mnt))


def fill(path: Path) -> int:
    """Write ``path`` until the file system has no space left; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        for size in (4096, 512, 1):  # the last partial blocks too
            while True:
                try:
                    written += f.write(b"\0" * size)
                except OSError:
                    break
    return written


@pytest.fixture
def full_disk_broker(tmp_path: Path) -> Iterator[tuple[Broker, Path]]:
    with small_file_system(tmp_path) as mnt:
        broker = Broker(data_dir=mnt / "data", port=0, workers=WORKERS).start()
        try:
            yield broker, mnt
        finally:
            broker.stop()


def _send_ids(sender, ids: list[str], key_of=lambda i: None) -> None:
    for i, mid in enumerate(ids):
        sender.send_messages(ServiceBusMessage(BODY, message_id=mid, partition_key=key_of(i)))


def _receive_all(receiver, limit: float = 20, until: int | None = None) -> list:
    got: list = []
    deadline = time.monotonic() + limit
    empty = 0
    while time.monotonic() < deadline and (until is None or len(got) < until):
        batch = receiver.receive_messages(max_message_count=100, max_wait_time=1)
        got += batch
        empty = 0 if batch else empty + 1
        if until is None and empty >= 2:
            break
    return got


def test_full_disk_refuses_sends_keeps_serving_and_recovers(full_disk_broker: tuple[Broker, Path]) -> None:
    broker, mnt = full_disk_broker
    name = f"full{next(_names)}"
    broker.namespace.create_queue(name, enable_partitioning=True)
    conn = broker.connection_string
    stored = [f"before-{i}" for i in range(200)]
    with ServiceBusClient.from_connection_string(conn, retry_total=0) as client:
        with client.get_queue_sender(name) as sender:
            _send_ids(sender, stored, key_of=lambda i: f"k{i % 7}" if i % 2 else None)

            filler = mnt / "filler"
            assert fill(filler) > 0
            refused = 0
            for i in range(12):  # keyed and keyless, single and batched: every one refused, none stored
                mid = f"while-full-{i}"
                try:
                    if i % 3 == 2:
                        sender.send_messages([ServiceBusMessage(BODY, message_id=f"{mid}-{j}") for j in range(3)])
                    else:
                        sender.send_messages(
                            ServiceBusMessage(BODY, message_id=mid, partition_key=f"k{i}" if i % 2 else None)
                        )
                except ServiceBusServerBusyError as exc:
                    assert "full" in str(exc), exc
                    refused += 1
            assert refused == 12

        # Receives and completes of what is stored go on while the disk is full.
        with client.get_queue_receiver(name, max_wait_time=1) as receiver:
            got = _receive_all(receiver, until=len(stored))
            assert sorted(str(m.message_id) for m in got) == sorted(stored)
            completed = {str(m.message_id) for m in got[:120]}
            for m in got[:120]:
                receiver.complete_message(m)
            for m in got[120:]:
                receiver.abandon_message(m)
            again = _receive_all(receiver, until=len(stored) - 120)
            assert sorted(str(m.message_id) for m in again) == sorted(set(stored) - completed)
            for m in again:
                receiver.abandon_message(m)
        assert broker.namespace.get_runtime_properties(name).availability == "Available"
        with pytest.raises(ServerBusy, match="full"):  # management that writes: retriable, nothing changed
            broker.namespace.create_queue(f"{name}-later")

        # Space returns: sends succeed again within a few seconds, no restart.
        filler.unlink()
        after = [f"after-{i}" for i in range(50)]
        deadline = time.monotonic() + 15
        with client.get_queue_sender(name) as sender:
            while True:
                try:
                    sender.send_messages(ServiceBusMessage(BODY, message_id=after[0]))
                    break
                except ServiceBusServerBusyError:
                    assert time.monotonic() < deadline, "sends still refused 15 s after space returned"
                    time.sleep(0.2)
        # Other partitions find out on their next send (each refuses for a second after its last full write):
        # the SDK's own retries (ServerBusy is retriable) cover that.
        with (
            ServiceBusClient.from_connection_string(conn) as retrying,
            retrying.get_queue_sender(name) as sender,
        ):
            _send_ids(sender, after[1:], key_of=lambda i: f"k{i % 5}" if i % 2 else None)
        with client.get_queue_receiver(name, max_wait_time=1) as receiver:
            rest = _receive_all(receiver, until=len(stored) - 120 + len(after))
            ids = [str(m.message_id) for m in rest]
            assert sorted(ids) == sorted((set(stored) - completed) | set(after)), "lost or duplicated"
            for m in rest:
                receiver.complete_message(m)
    # What was completed while the disk was full reached the store once space returned: after a restart of the
    # broker on the same data directory, nothing is left and nothing refused ever appears.
    broker.stop()
    again = Broker(data_dir=broker.data_dir, port=0, workers=WORKERS).start()
    try:
        with (
            ServiceBusClient.from_connection_string(again.connection_string, retry_total=0) as client,
            client.get_queue_receiver(name, max_wait_time=1) as receiver,
        ):
            assert receiver.peek_messages(max_message_count=100) == []
    finally:
        again.stop()


@pytest.mark.embedded_only
def test_full_disk_too_many_waiting_writes_reload_the_partition(
    full_disk_broker: tuple[Broker, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When too many settlements wait for space, the partition gives up on them and reloads from its store (by
    itself, within seconds): the messages whose completion was not stored come back (at-least-once)."""
    from shardbus.store import committer

    monkeypatch.setattr(committer, "MAX_KEPT_OPS", 3)
    broker, mnt = full_disk_broker
    name = f"full{next(_names)}"
    broker.namespace.create_queue(name)  # one partition
    stored = [f"m-{i}" for i in range(30)]
    with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client:
        with client.get_queue_sender(name) as sender:
            _send_ids(sender, stored)
        fill(mnt / "filler")
        with client.get_queue_receiver(name, max_wait_time=1) as receiver:
            got = _receive_all(receiver, until=len(stored))
            for m in got:
                with contextlib.suppress(Exception):  # the partition may go down under the last few
                    receiver.complete_message(m)
        partition = broker.namespace._sender_entity(name).partitions[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and partition.healthy:
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not partition.healthy:
            time.sleep(0.05)
        assert partition.healthy, partition.failure
        (mnt / "filler").unlink()
        with client.get_queue_receiver(name, max_wait_time=1) as receiver:
            back = _receive_all(receiver, until=len(stored))
            ids = {str(m.message_id) for m in back}
            assert ids <= set(stored) and ids, ids  # completions not stored came back; nothing else
            for m in back:
                receiver.complete_message(m)
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage(BODY, message_id=str(uuid.uuid4())))
