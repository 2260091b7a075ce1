"""A plain ``pip install .`` (no extras) serves: nothing on the paths of ``serve``, ``shardbus worker`` and the
CLI imports psycopg, pyspark or pyarrow, and a path that needs one says in one line which extra to install.

Every child process here runs with a ``sitecustomize`` that refuses those three packages (a meta-path finder), so
it behaves as on a machine where they were never installed, worker processes included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from serve_process import SERVE, ServeProcess

REFUSED = ("psycopg", "psycopg_binary", "pyspark", "pyarrow")
# The modules that exist for an extra, and the extra each names when it is missing.
EXTRA_ONLY = {
    "shardbus.store.postgres": "postgres",
    "shardbus.cluster.metadata": "postgres",
    "shardbus.cluster.placement": "postgres",
    "shardbus.spark": "spark",
    "pyspark_shardbus": "spark",
}
SITECUSTOMIZE = f"""
import sys

class _RefuseExtras:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {REFUSED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test)", name=name)
        return None

sys.meta_path.insert(0, _RefuseExtras())
"""


@pytest.fixture(scope="module")
def no_extras(tmp_path_factory) -> dict[str, str]:
    """An environment whose Python processes cannot import the optional packages."""
    folder = tmp_path_factory.mktemp("no_extras")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_the_refusal_works(no_extras):
    for name in REFUSED:
        if name == "psycopg_binary":
            continue
        done = run(no_extras, "-c", f"import {name}")
        assert done.returncode != 0 and "refused by the test" in done.stderr, done.stderr


def test_every_module_imports_or_names_its_extra(no_extras):
    script = textwrap.dedent(
        f"""
        import importlib, pkgutil, shardbus
        from shardbus.extras import MissingExtra
        extra_only = {EXTRA_ONLY!r}
        names = ["shardbus", "pyspark_shardbus"]
        names += [m.name for m in pkgutil.walk_packages(shardbus.__path__, "shardbus.") if not m.name.startswith(
            "shardbus.spark.")]
        for name in names:
            try:
                importlib.import_module(name)
            except MissingExtra as exc:
                print("MISSING", name, exc)
            except Exception as exc:
                print("BROKEN", name, type(exc).__name__, exc)
            else:
                print("OK", name)
        """
    )
    done = run(no_extras, "-c", script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("BROKEN")]
    missing = {line.split()[1]: line for line in lines if line.startswith("MISSING")}
    assert set(missing) == set(EXTRA_ONLY)
    for name, extra in EXTRA_ONLY.items():
        assert f"pip install 'shardbus[{extra}]'" in missing[name]
    ok = {line.split()[1] for line in lines if line.startswith("OK")}
    for needed in (
        "shardbus.cli",
        "shardbus.server",
        "shardbus.cluster.worker",
        "shardbus.cluster.supervisor",
        "shardbus.frontends",
        "shardbus.cli_commands",
        "shardbus.client",
    ):
        assert needed in ok


def _send_and_receive(conn_str: str, n: int = 20) -> None:
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(n)])
        got = []
        with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            while len(got) < n:
                batch = receiver.receive_messages(max_message_count=n, max_wait_time=5)
                if not batch:
                    break
                for message in batch:
                    got.append(str(message))
                    receiver.complete_message(message)
    assert sorted(got) == sorted(f"m{i}" for i in range(n))


CONFIG = (
    '{"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": [{"Name": "plain", "Properties": '
    '{"EnablePartitioning": true}}]}]}}'
)


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ([], "mode: partitions in this process (embedded)"),
        (["--workers", "1"], "mode: partitions in 1 worker process"),
        (["--workers", "1", "--frontends", "2"], "mode: 2 front-end processes, partitions in 1 worker process"),
    ],
    ids=["default", "workers", "frontends"],
)
def test_serve_without_extras(tmp_path, no_extras, flags, mode):
    config = tmp_path / "Config.json"
    config.write_text(CONFIG)
    args = ["--port", "0", "--data-dir", str(tmp_path / "data"), "--config", str(config), *flags]
    serve = ServeProcess(args, tmp_path / "serve.err", ready_prefix="health:", env=no_extras).wait_ready(60)
    try:
        assert mode in serve.lines, serve.lines
        _send_and_receive(serve.connection_string)
        # a CLI command for a running broker, in the same plain environment
        cli = run(
            no_extras,
            "-m",
            "shardbus.cli",
            "--connection-string",
            serve.connection_string,
            "--ca",
            str(tmp_path / "data" / "tls" / "ca.pem"),
            "queue",
            "list",
        )
        assert cli.returncode == 0, cli.stderr
        assert "plain" in cli.stdout
    finally:
        assert serve.stop() == 0, serve.stderr
    assert "Traceback" not in serve.stderr


@pytest.mark.parametrize(
    "command",
    [
        [*SERVE[1:], "--port", "0", "--metadata", "postgresql://127.0.0.1:1/none"],
        ["-m", "shardbus.cli", "worker", "--metadata", "postgresql://127.0.0.1:1/none"],
    ],
    ids=["serve", "worker"],
)
def test_a_path_that_needs_an_extra_names_it(tmp_path, no_extras, command):
    done = run(no_extras, *command, "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "pip install 'shardbus[postgres]'" in lines[0]
