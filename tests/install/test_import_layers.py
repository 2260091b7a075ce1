"""What a module loads says which layer it belongs to: the client (what the Spark connector and the CLI use) talks
to a broker over AMQP and loads nothing of the broker's core."""

from __future__ import annotations

import subprocess
import sys

CORE = ("shardbus.namespace", "shardbus.entity", "shardbus.partition", "shardbus.store", "shardbus.endpoint",
        "shardbus.http", "shardbus.cluster", "shardbus.server")


def loaded_by(statement: str) -> set[str]:
    script = f"import sys; {statement}; print('\\n'.join(m for m in sys.modules if m.startswith('shardbus')))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split())


def test_the_client_loads_nothing_of_the_core():
    loaded = loaded_by("import shardbus.client")
    assert not [m for m in loaded if m.startswith(CORE)], sorted(loaded)


def test_the_package_api_is_there_on_first_use():
    loaded = loaded_by("import shardbus; shardbus.Namespace; shardbus.Message; shardbus.EntityNotFound")
    assert "shardbus.namespace" in loaded
    loaded = loaded_by("from shardbus import *")
    assert "shardbus.namespace" in loaded
