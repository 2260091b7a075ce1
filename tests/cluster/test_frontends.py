"""``shardbus serve --workers 2 --frontends 2`` as a real process: two front-end processes share one port over two
workers, and the official SDK (AMQP and the admin client over HTTPS) cannot tell them apart.

SO_REUSEPORT lets the kernel pick the front end of each new connection; the tests find out which one a client
landed on by asking ``/proc`` which front-end process holds the server end of the client's new socket, and open
connections until they have one on the front end they want.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient, SqlRuleFilter

import shardbus
from serve_process import ServeProcess
from shardbus.model.routing import partition_for_key

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds connections' front ends through /proc"),
]

LOCK = timedelta(seconds=5)  # the shortest lock duration the service allows
SAMPLE_CONFIG = Path(__file__).parent.parent / "core" / "data" / "emulator_config.json"


class Served(ServeProcess):
    """``serve --workers 2 --frontends 2`` on its own data directory; ready once it lists its front ends."""

    def __init__(self, data: Path, log: Path, *extra: str) -> None:
        self.data = data
        args = ["--port", "0", "--data-dir", str(data), "--workers", "2", "--frontends", "2", *extra]
        super().__init__(args, log, ready_prefix="health:")

    def frontend_pids(self) -> list[int]:
        """The live front-end children of the serve process."""
        return self._children(lambda cmdline: b"shardbus.frontends" in cmdline)

    def worker_pids(self) -> list[int]:
        """The live worker children (first started by forking the serve process, so named like it)."""
        return self._children(lambda cmdline: b"shardbus.frontends" not in cmdline)

    def _children(self, wanted: Callable[[bytes], bool]) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == self.proc.pid and fields[0] != "Z" and wanted(cmdline):
                pids.append(int(entry))
        return sorted(pids)

    def health_pid(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=10) as response:
            body = json.load(response)
        assert body["ready"] is True
        return body["pid"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frontends")
    s = Served(tmp / "data", tmp / "serve.log").wait_ready(60)
    yield s
    s.kill()


@pytest.fixture(scope="module")
def admin(served):
    with ServiceBusAdministrationClient.from_connection_string(
        served.connection_string, connection_verify=str(served.data / "tls" / "ca.pem"), retry_total=0
    ) as client:
        yield client


def _peer_ports(pid: int, port: int) -> set[int]:
    """Client ports of the established connections process ``pid`` serves on ``port``."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    peers = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "01" and f[9] in inodes and int(f[1].rsplit(":", 1)[1], 16) == port:
                peers.add(int(f[2].rsplit(":", 1)[1], 16))
    return peers


def open_on(served: Served, pid: int, make: Callable[[], Any], tries: int = 60) -> Any:
    """A client handler (SDK sender or receiver, opened) whose connection landed on front end ``pid``."""
    pids = served.frontend_pids()
    for _ in range(tries):
        before = {p: _peer_ports(p, served.port) for p in pids}
        handler = make()
        handler.__enter__()
        landed = [p for p in pids if _peer_ports(p, served.port) - before[p]]
        if landed == [pid]:
            return handler
        handler.close()
    raise AssertionError(f"no connection landed on front end {pid} in {tries} tries")


def _new_pids(pids: list[int], *old: int) -> list[int]:
    return [p for p in pids if p not in old]


def _wait_until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# --- tests, in order: the last one stops the server ---------------------------------------------------------------
def test_both_front_ends_answer_on_one_port(served):
    frontends = served.frontend_pids()
    assert len(frontends) == 2
    seen = {served.health_pid() for _ in range(40)}
    assert seen == set(frontends), f"/health answered from {seen}, front ends are {frontends}"


def test_an_entity_created_through_the_admin_client_works_through_both_front_ends(served, admin):
    admin.create_queue("shared", enable_partitioning=True)
    a, b = served.frontend_pids()
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        for pid in (a, b):
            with open_on(served, pid, lambda: client.get_queue_sender("shared")) as sender:
                sender.send_messages([ServiceBusMessage(f"via-{pid}-{i}") for i in range(5)])
        sent = sorted(f"via-{pid}-{i}" for pid in (a, b) for i in range(5))
        got: list[str] = []
        for pid in (a, b):
            with open_on(served, pid, lambda: client.get_queue_receiver("shared")) as receiver:
                deadline = time.monotonic() + 30
                while len(got) < len(sent) and time.monotonic() < deadline:
                    # each front end's receivers get messages from every partition, whoever sent them
                    for m in receiver.receive_messages(max_message_count=len(sent) // 2, max_wait_time=5):
                        receiver.complete_message(m)
                        got.append(str(m))
                    if pid == a and len(got) >= len(sent) // 2:
                        break
    assert sorted(got) == sent


def _send_until_accepted(sender: Any, message: ServiceBusMessage, timeout: float = 90.0) -> None:
    """Send, retrying while the partition is unavailable (ServerBusy) until its worker is back."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sender.send_messages(message)
            return
        except ServiceBusError:
            assert time.monotonic() < deadline, "the partition did not come back"
            time.sleep(0.2)


def test_a_killed_worker_comes_back_on_its_port_for_both_front_ends(served, admin):
    """Early in the module: after a worker restart each front end restores its partitions one by one, so the
    fewer entities exist, the sooner they are back."""
    admin.create_queue("keyed", enable_partitioning=True)
    keys: dict[int, str] = {}  # one key per partition: every partition, on both workers, gets a message
    for i in range(10_000):
        keys.setdefault(partition_for_key(f"k{i}", 16), f"k{i}")
    assert len(keys) == 16
    victim, survivor = served.worker_pids()
    os.kill(victim, signal.SIGKILL)
    _wait_until(lambda: _new_pids(served.worker_pids(), victim, survivor))
    sent: list[str] = []
    with ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client:
        for pid in served.frontend_pids():
            with open_on(served, pid, lambda: client.get_queue_sender("keyed")) as sender:
                for key in keys.values():
                    _send_until_accepted(sender, ServiceBusMessage(f"{pid}-{key}", partition_key=key))
                    sent.append(f"{pid}-{key}")
        got: list[str] = []
        with client.get_queue_receiver("keyed") as receiver:
            deadline = time.monotonic() + 30
            while len(got) < len(sent) and time.monotonic() < deadline:
                for m in receiver.receive_messages(max_message_count=len(sent), max_wait_time=5):
                    receiver.complete_message(m)
                    got.append(str(m))
    assert sorted(got) == sorted(sent)


def _admin_on(served: Served, pid: int) -> ServiceBusAdministrationClient:
    """An admin client whose (kept-alive) HTTPS connection is served by front end ``pid``."""
    for _ in range(60):
        before = {p: _peer_ports(p, served.port) for p in served.frontend_pids()}
        client = ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=str(served.data / "tls" / "ca.pem"), retry_total=0
        )
        list(client.list_queues())
        landed = [p for p, ports in before.items() if _peer_ports(p, served.port) - ports]
        if landed == [pid]:
            return client
        client.close()
    raise AssertionError(f"no admin connection landed on front end {pid}")


def test_management_through_one_front_end_is_seen_by_the_other(served):
    a, b = served.frontend_pids()
    on_a, on_b = _admin_on(served, a), _admin_on(served, b)
    try:
        on_a.create_topic("news")
        on_a.create_subscription("news", "eu")
        on_a.create_rule("news", "eu", "region", filter=SqlRuleFilter("region = 'eu'"))
        assert {r.name for r in on_b.list_rules("news", "eu")} == {"$Default", "region"}
        queue = on_b.get_queue("shared")
        queue.max_delivery_count = 3
        on_b.update_queue(queue)
        assert on_a.get_queue("shared").max_delivery_count == 3
        on_b.delete_rule("news", "eu", "$Default")
        assert [r.name for r in on_a.list_rules("news", "eu")] == ["region"]
        on_a.delete_subscription("news", "eu")
        with pytest.raises(ResourceNotFoundError):
            on_b.get_subscription("news", "eu")
        on_b.delete_topic("news")
        with pytest.raises(ResourceNotFoundError):
            on_a.get_topic("news")
        assert "news" not in {t.name for t in on_a.list_topics()}
    finally:
        on_a.close()
        on_b.close()


def test_creating_one_name_through_both_front_ends_at_once_succeeds_once(served):
    a, b = served.frontend_pids()
    clients = [_admin_on(served, a), _admin_on(served, b)]
    names = [f"race{i}" for i in range(8)]
    outcomes: dict[str, list[str]] = {n: [] for n in names}
    barrier = threading.Barrier(2)

    def create(client: ServiceBusAdministrationClient) -> None:
        for n in names:
            barrier.wait()
            try:
                client.create_queue(n, enable_partitioning=True)
                outcomes[n].append("created")
            except ResourceExistsError:
                outcomes[n].append("exists")

    try:
        threads = [threading.Thread(target=create, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert {n: sorted(o) for n, o in outcomes.items()} == {n: ["created", "exists"] for n in names}
        for client in clients:
            listed = [q.name for q in client.list_queues() if q.name.startswith("race")]
            assert sorted(listed) == sorted(names)
    finally:
        for c in clients:
            c.close()


def test_a_message_locked_through_one_front_end_reaches_the_other_only_when_its_lock_expires(served, admin):
    admin.create_queue("locks", enable_partitioning=True, lock_duration=LOCK)
    a, b = served.frontend_pids()
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        with client.get_queue_sender("locks") as sender:
            sender.send_messages(ServiceBusMessage("held"))
        on_a = open_on(served, a, lambda: client.get_queue_receiver("locks"))
        on_b = open_on(served, b, lambda: client.get_queue_receiver("locks"))
        try:
            [first] = on_a.receive_messages(max_message_count=1, max_wait_time=10)
            assert str(first) == "held"
            again: list[Any] = []
            polls = 0
            deadline = time.monotonic() + 60
            while not again and time.monotonic() < deadline:
                again = on_b.receive_messages(max_message_count=1, max_wait_time=1)
                polls += 1
            received_at = datetime.now(UTC)
            assert [str(m) for m in again] == ["held"]
            # never before the lock taken through the other front end expired (clocks: same host)
            assert received_at >= first.locked_until_utc - timedelta(milliseconds=200), (received_at, polls)
            assert again[0].delivery_count == 1
            on_b.complete_message(again[0])
            with pytest.raises(ServiceBusError):
                on_a.complete_message(first)  # its lock is gone
        finally:
            on_a.close()
            on_b.close()


def test_a_killed_front_end_is_restarted_and_nothing_acknowledged_is_lost(served, admin):
    admin.create_queue("durable", enable_partitioning=True, lock_duration=LOCK)
    victim, survivor = served.frontend_pids()
    sent = [f"m{i}" for i in range(40)]
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        sender = open_on(served, victim, lambda: client.get_queue_sender("durable"))
        sender.send_messages([ServiceBusMessage(body) for body in sent[:20]])
        for body in sent[20:]:
            sender.send_messages(ServiceBusMessage(body, partition_key=body))
        receiver = open_on(served, victim, lambda: client.get_queue_receiver("durable", prefetch_count=10))
        held = receiver.receive_messages(max_message_count=5, max_wait_time=5)  # locked there, never settled
        assert held
        os.kill(victim, signal.SIGKILL)
        _wait_until(lambda: _new_pids(served.frontend_pids(), victim, survivor))
        [restarted] = _new_pids(served.frontend_pids(), victim, survivor)
        _wait_until(lambda: served.health_pid() == restarted)
        for handler in (sender, receiver):
            try:
                handler.close()
            except Exception:
                pass  # its connection died with the front end
        with open_on(served, restarted, lambda: client.get_queue_sender("durable")) as again:
            again.send_messages(ServiceBusMessage("after"))
        got: set[str] = set()
        with client.get_queue_receiver("durable") as r:
            deadline = time.monotonic() + 60
            while len(got) < len(sent) + 1 and time.monotonic() < deadline:
                for m in r.receive_messages(max_message_count=50, max_wait_time=2):
                    r.complete_message(m)
                    got.add(str(m))
    assert got == {*sent, "after"}


def test_sigterm_stops_everything_and_keeps_what_was_acknowledged(served, admin):
    admin.create_queue("last", enable_partitioning=True)
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        with client.get_queue_sender("last") as sender:
            sender.send_messages([ServiceBusMessage(f"kept-{i}") for i in range(10)])
    frontends = served.frontend_pids()
    assert served.stop(timeout=60) == 0
    assert "shardbus stopped; everything acknowledged is on disk." in served.lines
    assert not [pid for pid in frontends if Path(f"/proc/{pid}").exists()]  # stopped and reaped
    with shardbus.Namespace.open(served.data) as ns:
        assert sorted(m.body.decode() for m in ns.browse("last")) == sorted(f"kept-{i}" for i in range(10))


def test_a_config_is_applied_once_and_orphans_are_removed_before_front_ends_start(tmp_path):
    data = tmp_path / "data"
    with shardbus.Namespace.open(data) as ns:
        ns.create_queue("kept")
    orphan = data / "sbemulatorns" / "entities" / "987654"  # a creation a crash cut short
    orphan.mkdir(parents=True)
    (orphan / "p00.db").write_bytes(b"")
    s = Served(data, tmp_path / "serve.log", "--config", str(SAMPLE_CONFIG)).wait_ready(60)
    try:
        assert not orphan.exists()
        for pid in s.frontend_pids():
            client = _admin_on(s, pid)
            try:
                names = {q.name for q in client.list_queues()}
                assert {"kept", "queue.1"} <= names, (pid, names)
                assert {sub.name for sub in client.list_subscriptions("topic.1")} >= {"subscription.1"}
            finally:
                client.close()
    finally:
        assert s.stop(timeout=60) == 0
