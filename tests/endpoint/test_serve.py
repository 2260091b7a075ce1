"""``shardbus serve`` as a real process: start-up time, signals, durability across restarts, ``--config``, help.

Each test runs ``python -m shardbus.cli serve`` in a child process with its own data directory and talks to it
through the official SDK (sync client). Entities that a test needs are created beforehand by opening the data
directory with ``shardbus.Namespace.open`` (the server has no entity-management endpoint) or by ``--config``.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusAuthenticationError

import shardbus
from serve_process import ServeProcess
from shardbus.model.routing import decode_sequence_number

SAMPLE_CONFIG = Path(__file__).parent.parent / "core" / "data" / "emulator_config.json"
READY_LIMIT = 1.0  # seconds from process start to the printed connection string (the requirement)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def serve(tmp_path):
    """Factory: start ``shardbus serve *args``; every process still running at the end is killed."""
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        s = ServeProcess(list(args), tmp_path / f"stderr-{time.monotonic_ns()}.txt", cwd=tmp_path)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def make_queue(data_dir: Path, name: str = "orders", **props) -> None:
    with shardbus.Namespace.open(data_dir) as ns:
        ns.create_queue(name, **props)


def counts(data_dir: Path, path: str) -> shardbus.RuntimeProperties:
    with shardbus.Namespace.open(data_dir) as ns:
        return ns.get_runtime_properties(path)


def bodies(data_dir: Path, path: str) -> list[str]:
    with shardbus.Namespace.open(data_dir) as ns:
        return sorted(m.body.decode() for m in ns.browse(path))


def send_mix(conn_str: str, queue: str) -> list[str]:
    """Singles (keyed and keyless), a list and a batch; returns the bodies."""
    sent: list[str] = []
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender(queue) as sender:
        for i in range(10):
            sender.send_messages(ServiceBusMessage(f"single-{i}", partition_key=f"k{i % 3}" if i % 2 else None))
            sent.append(f"single-{i}")
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(5)])
        sent += [f"list-{i}" for i in range(5)]
        batch = sender.create_message_batch()
        for i in range(20):
            batch.add_message(ServiceBusMessage(f"batch-{i}", partition_key="b"))
        sender.send_messages(batch)
        sent += [f"batch-{i}" for i in range(20)]
    return sorted(sent)


def assert_clean_stop(s: ServeProcess, rc: int) -> None:
    assert rc == 0, f"exit code {rc}; stderr={s.stderr!r}"
    assert "shardbus stopped; everything acknowledged is on disk." in s.lines
    assert "Traceback" not in s.stderr and "Task was destroyed" not in s.stderr, s.stderr


def start_ready(serve, *args: str, attempts: int = 3) -> ServeProcess:
    """Start ``shardbus serve *args`` and check the 1 s start-up. CI runs two test passes at once on 2 cores: the
    time the process waited for a CPU that others held is the machine's load, not the start-up's, and is not
    counted (``ServeProcess.ready_own``); a start that a busy moment still made slow is tried again, and the
    check fails only when no start of ``attempts`` is fast."""
    times = []
    for _ in range(attempts):
        s = serve(*args).wait_ready()
        times.append(f"{s.ready_own:.3f} (+{s.ready_cpu_wait:.3f} waiting for a CPU)")
        if s.ready_own < READY_LIMIT:
            return s
        assert_clean_stop(s, s.stop())
    raise AssertionError(f"ready after {', '.join(times)} s (limit {READY_LIMIT} s)")


# --- start-up ---------------------------------------------------------------------------------------------------
def test_ready_within_one_second_and_serves_the_sdk(serve, tmp_path):
    data = tmp_path / "data"
    make_queue(data, enable_partitioning=True)  # 16 partition stores to open at start-up
    port = free_port()
    s = start_ready(serve, "--port", str(port), "--data-dir", str(data))
    print(
        f"ready after {s.ready_after:.3f} s (process start to the connection-string line), "
        f"{s.ready_cpu_wait:.3f} s of it waiting for a CPU"
    )
    assert s.port == port
    assert s.lines[0].startswith(f"shardbus listening on 127.0.0.1:{port} ")
    assert f"data directory: {data}" in s.lines
    assert s.connection_string == (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    assert can_connect(port)
    with ServiceBusClient.from_connection_string(s.connection_string) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("hello"))
        with client.get_queue_receiver("orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r:
            assert [str(m) for m in r.receive_messages(max_wait_time=5)] == ["hello"]
    print(f"first SDK send and receive done {time.monotonic() - s.started:.3f} s after process start")
    assert_clean_stop(s, s.stop())


def test_fresh_data_dir_and_port_zero(serve, tmp_path):
    """A data directory that does not exist yet is created; ``--port 0`` prints the port actually bound."""
    data = tmp_path / "new" / "dir"
    s = start_ready(serve, "--port", "0", "--data-dir", str(data))
    print(f"ready after {s.ready_after:.3f} s on a fresh data directory")
    assert s.port and s.port != 0 and can_connect(s.port)
    assert s.lines[0].startswith(f"shardbus listening on 127.0.0.1:{s.port} ")
    assert data.is_dir()
    assert_clean_stop(s, s.stop())
    with shardbus.Namespace.open(data) as ns:
        assert list(ns.list_queues()) == []


def test_key_and_namespace_options(serve, tmp_path):
    data = tmp_path / "data"
    with shardbus.Namespace.open(data, name="myns") as ns:
        ns.create_queue("orders")
    s = serve("--port", "0", "--data-dir", str(data), "--key", "s3cret", "--namespace", "myns").wait_ready()
    assert "SharedAccessKey=s3cret;" in s.connection_string
    with ServiceBusClient.from_connection_string(s.connection_string) as client:
        with client.get_queue_sender("orders") as sender:  # the queue exists in "myns" only
            sender.send_messages(ServiceBusMessage("x"))
    wrong = s.connection_string.replace("s3cret", "SAS_KEY_VALUE")
    with (
        ServiceBusClient.from_connection_string(wrong, retry_total=0) as client,
        pytest.raises(ServiceBusAuthenticationError),
        client.get_queue_sender("orders") as sender,
    ):
        sender.send_messages(ServiceBusMessage("y"))
    assert_clean_stop(s, s.stop())
    with shardbus.Namespace.open(data, name="myns") as ns:
        assert ns.get_runtime_properties("orders").active_message_count == 1


def test_port_in_use_exits_non_zero(serve, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = serve("--port", str(port), "--data-dir", str(tmp_path / "data"))
        rc = s.proc.wait(10)
    s.stop()
    assert rc != 0
    assert f"cannot listen on 127.0.0.1:{port}" in s.stderr
    assert s.connection_string is None


# --- signals and durability ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_cleanly_and_keeps_every_message(serve, tmp_path, sig):
    data = tmp_path / "data"
    make_queue(data, enable_partitioning=True)
    s = serve("--port", "0", "--data-dir", str(data)).wait_ready()
    sent = send_mix(s.connection_string, "orders")

    t0 = time.monotonic()
    rc = s.stop(sig)
    print(f"{signal.Signals(sig).name}: exited in {time.monotonic() - t0:.3f} s")
    assert_clean_stop(s, rc)
    assert not can_connect(s.port)

    assert counts(data, "orders").active_message_count == len(sent)
    assert bodies(data, "orders") == sent

    # Restarted on the same data directory, the SDK receives every message, and completions are durable too.
    again = start_ready(serve, "--port", "0", "--data-dir", str(data))
    print(f"restart: ready after {again.ready_after:.3f} s")
    got: list = []
    with (
        ServiceBusClient.from_connection_string(again.connection_string) as client,
        client.get_queue_receiver("orders") as receiver,
    ):
        deadline = time.monotonic() + 10
        while len(got) < len(sent) and time.monotonic() < deadline:
            batch = receiver.receive_messages(max_message_count=len(sent) - len(got), max_wait_time=1)
            for m in batch:
                receiver.complete_message(m)
            got += batch
    assert sorted(str(m) for m in got) == sent
    assert all(m.delivery_count == 0 for m in got)
    assert len({decode_sequence_number(m.sequence_number)[0] for m in got}) > 1  # really spread over partitions
    assert_clean_stop(again, again.stop(sig))
    assert counts(data, "orders").total_message_count == 0


def test_deferred_scheduled_dead_lettered_and_locked_messages_survive_a_restart(serve, tmp_path):
    data = tmp_path / "data"
    make_queue(data, enable_partitioning=True)
    s = serve("--port", "0", "--data-dir", str(data)).wait_ready()
    far = datetime.now(UTC) + timedelta(hours=1)
    with ServiceBusClient.from_connection_string(s.connection_string) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(b, partition_key="k") for b in ("dead", "deferred", "locked")])
            (scheduled_seq,) = sender.schedule_messages(ServiceBusMessage("scheduled"), far)
        with client.get_queue_receiver("orders") as receiver:
            got = {str(m): m for m in receiver.receive_messages(max_message_count=3, max_wait_time=5)}
            assert set(got) == {"dead", "deferred", "locked"}  # one partition, so one receive gets all three
            receiver.dead_letter_message(got["dead"], reason="bad", error_description="why")
            receiver.defer_message(got["deferred"])
            deferred_seq = got["deferred"].sequence_number
            # "locked" is still locked by this open receiver when the broker stops.
            assert_clean_stop(s, s.stop(signal.SIGTERM))
    props = counts(data, "orders")
    assert (props.dead_letter_message_count, props.scheduled_message_count, props.total_message_count) == (1, 1, 4)

    again = serve("--port", "0", "--data-dir", str(data)).wait_ready()
    with ServiceBusClient.from_connection_string(again.connection_string) as client:
        with client.get_queue_receiver("orders") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            assert str(m) == "locked"  # locks do not survive a restart: available again
            receiver.complete_message(m)
            (d,) = receiver.receive_deferred_messages([deferred_seq])
            assert str(d) == "deferred"
            receiver.complete_message(d)
            (p,) = receiver.peek_messages(1, sequence_number=scheduled_seq)
            assert (str(p), p.sequence_number) == ("scheduled", scheduled_seq)
        with client.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dl,) = dlq.receive_messages(max_wait_time=5)
            assert (str(dl), dl.dead_letter_reason, dl.dead_letter_error_description) == ("dead", "bad", "why")
            dlq.complete_message(dl)
        with client.get_queue_sender("orders") as sender:
            sender.cancel_scheduled_messages(scheduled_seq)
    assert_clean_stop(again, again.stop())
    assert counts(data, "orders").total_message_count == 0


def stop_while_sending(serve, data: Path, senders: int = 4) -> tuple[ServeProcess, int, list[str], list[BaseException]]:
    """Start, keep ``senders`` SDK senders busy, SIGTERM once 200 sends are acknowledged; return what happened."""
    make_queue(data, enable_partitioning=True)
    s = serve("--port", "0", "--data-dir", str(data)).wait_ready()
    acked: list[str] = []
    failures: list[BaseException] = []
    enough = threading.Event()

    def pump(n: int) -> None:
        try:
            with (
                ServiceBusClient.from_connection_string(s.connection_string, retry_total=0) as client,
                client.get_queue_sender("orders") as sender,
            ):
                for i in range(100_000):
                    sender.send_messages(ServiceBusMessage(f"{n}-{i}", partition_key=f"k{n}" if n % 2 else None))
                    acked.append(f"{n}-{i}")
                    if len(acked) >= 200:
                        enough.set()
        except BaseException as exc:  # the connection goes away under the sender
            failures.append(exc)
        finally:
            enough.set()

    threads = [threading.Thread(target=pump, args=(n,), daemon=True) for n in range(senders)]
    for t in threads:
        t.start()
    assert enough.wait(30)
    rc = s.stop(signal.SIGTERM)
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    return s, rc, acked, failures


def test_acknowledged_sends_survive_a_signal_mid_stream(serve, tmp_path):
    """Senders are busy when SIGTERM arrives: every send the SDK saw acknowledged is on disk afterwards."""
    data = tmp_path / "data"
    s, rc, acked, failures = stop_while_sending(serve, data)
    assert rc == 0, s.stderr
    assert "shardbus stopped; everything acknowledged is on disk." in s.lines
    assert len(failures) == 4, "every sender should have seen the broker go away"
    stored = set(bodies(data, "orders"))
    missing = [b for b in acked if b not in stored]
    assert not missing, f"{len(missing)} acknowledged sends lost, e.g. {missing[:5]}"
    assert len(stored) <= len(acked) + 4  # at most one send per sender in flight: stored, not acknowledged
    print(f"{len(acked)} acknowledged, {len(stored)} stored")


def test_stop_while_sending_logs_no_error(serve, tmp_path):
    # A commit must still be in flight when the loop closes (about 11 runs out of 12): three runs make a
    # regression practically certain to show.
    for attempt in range(3):
        s, rc, _, _ = stop_while_sending(serve, tmp_path / f"data{attempt}")
        assert_clean_stop(s, rc)


# --- --config -----------------------------------------------------------------------------------------------------
def test_config_creates_entities(serve, tmp_path):
    data = tmp_path / "data"
    s = start_ready(serve, "--port", "0", "--data-dir", str(data), "--config", str(SAMPLE_CONFIG))
    print(f"ready with the sample config after {s.ready_after:.3f} s")
    with ServiceBusClient.from_connection_string(s.connection_string) as client:
        with client.get_queue_sender("queue.1") as sender:
            sender.send_messages(ServiceBusMessage("to queue.1"))
        with client.get_topic_sender("topic.1") as sender:
            sender.send_messages(ServiceBusMessage("to topic.1"))
        with client.get_queue_receiver("queue.1", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r:
            assert [str(m) for m in r.receive_messages(max_wait_time=5)] == ["to queue.1"]
        # subscription.3 has no rules (it keeps $Default and receives everything)
        with client.get_subscription_receiver(
            "topic.1", "subscription.3", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as r:
            assert [str(m) for m in r.receive_messages(max_wait_time=5)] == ["to topic.1"]
    assert_clean_stop(s, s.stop())
    with shardbus.Namespace.open(data) as ns:
        q = ns.get_queue("queue.1")
        assert q.max_delivery_count == 3
        assert {sub.name for sub in ns.list_subscriptions("topic.1")} >= {"subscription.1", "subscription.2"}
        # the correlation filter of subscription.1 did not match a message without those properties
        assert ns.get_runtime_properties("topic.1/Subscriptions/subscription.1").active_message_count == 0


def _break(path_to_props, key, value):
    def mutate(cfg):
        target = cfg["UserConfig"]["Namespaces"][0]
        for step in path_to_props:
            target = target[step]
        if value is _RENAME:
            target[key + "r"] = target.pop(key)
        else:
            target[key] = value

    return mutate


_RENAME = object()

BROKEN = [
    pytest.param(
        _break(["Queues", 0, "Properties"], "LockDuration", "PT10M"),
        "UserConfig.Namespaces[0].Queues[0].Properties.LockDuration",
        id="lock-duration-out-of-range",
    ),
    pytest.param(
        _break(["Queues", 0, "Properties"], "LockDuration", _RENAME),
        "UserConfig.Namespaces[0].Queues[0].Properties.LockDurationr",
        id="unknown-property",
    ),
    pytest.param(
        _break(["Topics", 0, "Subscriptions", 1, "Properties"], "MaxDeliveryCount", 0),
        "UserConfig.Namespaces[0].Topics[0].Subscriptions[1].Properties.MaxDeliveryCount",
        id="subscription-max-delivery-count",
    ),
    pytest.param(None, "not valid JSON", id="not-json"),
]


@pytest.mark.parametrize(("mutate", "expected"), BROKEN)
def test_config_error_exits_non_zero_names_the_path_and_does_not_listen(serve, tmp_path, mutate, expected):
    cfg_file = tmp_path / "Config.json"
    if mutate is None:
        cfg_file.write_text('{"UserConfig": {"Namespaces": [')
    else:
        cfg = copy.deepcopy(json.loads(SAMPLE_CONFIG.read_text()))
        mutate(cfg)
        cfg_file.write_text(json.dumps(cfg))
    data = tmp_path / "data"
    port = free_port()
    s = serve("--port", str(port), "--data-dir", str(data), "--config", str(cfg_file))
    rc = s.proc.wait(10)
    s.stop()
    assert rc != 0
    assert expected in s.stderr, s.stderr
    assert str(cfg_file) in s.stderr  # which file
    assert not any("listening" in line or "connection string" in line for line in s.lines), s.lines
    assert not can_connect(port)
    assert not data.exists() or not any(data.iterdir())  # validated before anything is created


def test_missing_config_file(serve, tmp_path):
    s = serve("--port", "0", "--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "nope.json"))
    rc = s.proc.wait(10)
    s.stop()
    assert rc != 0
    assert "nope.json" in s.stderr and s.connection_string is None


# --- help -------------------------------------------------------------------------------------------------------
def test_help_lists_the_defaults():
    out = subprocess.run(
        [sys.executable, "-m", "shardbus.cli", "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    for default in ("5672", "./shardbus-data", "SAS_KEY_VALUE", "sbemulatorns"):
        assert default in out.stdout, f"{default!r} missing from:\n{out.stdout}"


def test_help_names_every_option():
    out = subprocess.run(
        [sys.executable, "-m", "shardbus.cli", "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    for option in ("--port", "--data-dir", "--key", "--namespace", "--config", "--host", "--log-level"):
        assert option in out.stdout


def test_console_script_is_installed():
    script = Path(sys.executable).parent / ("shardbus.exe" if os.name == "nt" else "shardbus")
    out = subprocess.run([str(script), "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--data-dir" in out.stdout
