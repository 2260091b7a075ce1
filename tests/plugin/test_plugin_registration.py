"""The plugin as an installed package provides it: found through the ``pytest11`` entry point by a pytest run in a
directory with no conftest, lazy (a test that uses no fixture starts nothing), with its options honoured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

USER_TESTS = """
import os
import sys


def test_a_test_without_the_fixtures_starts_no_broker():
    assert "shardbus.server" not in sys.modules


def test_first(shardbus_namespace, shardbus_connection_string):
    assert "Endpoint=sb://localhost:" in shardbus_connection_string
    shardbus_namespace.create_queue("left-behind")


def test_second(shardbus_namespace):
    names = sorted(q.name for q in shardbus_namespace.list_queues())
    assert names == os.environ["EXPECTED_QUEUES"].split(",")
"""

CONFIG = {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": [{"Name": "configured"}]}]}}


def run_pytest(tmp_path, *args: str, expected_queues: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EXPECTED_"))}
    env["EXPECTED_QUEUES"] = expected_queues
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_user.py", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_entry_point_plugin_serves_a_suite_without_conftest(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    (tmp_path / "Config.json").write_text(json.dumps(CONFIG))

    default = run_pytest(tmp_path, "--shardbus-config", "Config.json", expected_queues="configured")
    assert "3 passed" in default.stdout, default.stdout + default.stderr
    assert "shardbus: started in" in default.stdout  # the -v summary line with the start and reset times

    kept = run_pytest(
        tmp_path, "--shardbus-config=Config.json", "--shardbus-reset=none", expected_queues="configured,left-behind"
    )
    assert "3 passed" in kept.stdout, kept.stdout + kept.stderr


def test_the_fixtures_are_listed(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for name in ("shardbus_connection_string", "shardbus_namespace", "shardbus_ca_path", "shardbus_broker"):
        assert name in out
