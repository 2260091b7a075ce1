"""The README's commands, run as a new user runs them: on a fresh ``git clone`` of this checkout, in a virtual
environment of their own, with nothing from this test run installed.

``bash scripts/run.sh`` must install (no extras) and serve: 100 messages sent and received with the official SDK,
a queue created with the admin client, and a clean exit on SIGTERM. ``bash examples/pipeline/run.sh`` must run the
pipeline end to end with a small ORDERS. What is cloned is the checkout's HEAD (in CI, the submitted commit)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 600  # a fresh virtual environment with pip's cache, on a loaded 2-core machine

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a git checkout"
)


def fresh_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    return clone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    """The environment a user's shell would have: nothing of this test run's virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


@pytest.mark.timeout(INSTALL_TIMEOUT + 120)
def test_run_sh_installs_and_serves(tmp_path):
    clone = fresh_clone(tmp_path)
    port, data = free_port(), tmp_path / "data"
    lines: list[str] = []
    ready = threading.Event()
    proc = subprocess.Popen(
        ["bash", "scripts/run.sh", "--port", str(port), "--data-dir", str(data)],
        cwd=clone,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("health:"):
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(INSTALL_TIMEOUT)
        assert proc.poll() is None and any(x.startswith("health:") for x in lines), "\n".join(lines)
        assert "mode: partitions in this process (embedded)" in lines
        conn = next(x for x in lines if x.startswith("connection string: ")).removeprefix("connection string: ")
        # the installed package is a plain install: no optional package came with it
        check = subprocess.run(
            [
                str(clone / ".venv" / "bin" / "python"),
                "-c",
                "import importlib.util as u, sys; "
                "sys.exit(any(u.find_spec(m) for m in ('psycopg', 'pyspark', 'pyarrow')))",
            ],
            timeout=60,
        )
        assert check.returncode == 0, "scripts/run.sh installed an optional package"

        with ServiceBusAdministrationClient.from_connection_string(
            conn, connection_verify=str(data / "tls" / "ca.pem")
        ) as admin:
            admin.create_queue("readme", enable_partitioning=True)
            assert admin.get_queue("readme").enable_partitioning
        with ServiceBusClient.from_connection_string(conn) as client:
            with client.get_queue_sender("readme") as sender:
                batch = sender.create_message_batch()  # a keyless batch: one partition, chosen by the broker
                for i in range(50):
                    batch.add_message(ServiceBusMessage(f"m{i}"))
                sender.send_messages(batch)
                for i in range(50, 100):  # keyed, each to its key's partition
                    sender.send_messages(ServiceBusMessage(f"m{i}", partition_key=f"k{i % 7}"))
            got: list[str] = []
            with client.get_queue_receiver("readme", max_wait_time=5) as receiver:
                while len(got) < 100:
                    received = receiver.receive_messages(max_message_count=100, max_wait_time=5)
                    if not received:
                        break
                    for message in received:
                        got.append(str(message))
                        receiver.complete_message(message)
        assert sorted(got) == sorted(f"m{i}" for i in range(100))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(5)
    assert rc == 0, "\n".join(lines)
    assert "Traceback" not in "\n".join(lines)


@pytest.mark.timeout(INSTALL_TIMEOUT + 300)
def test_pipeline_example_runs(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")
    clone = fresh_clone(tmp_path)
    env = clean_env() | {"ORDERS": "300", "PORT": str(free_port())}
    done = subprocess.run(
        ["bash", "examples/pipeline/run.sh"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT + 240,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "Parquet output:" in done.stdout
    assert " customers, " in done.stdout and " alerts in " in done.stdout, done.stdout
    assert "Traceback" not in out
