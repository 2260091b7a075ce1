"""One real broker per module for the CLI tests, and a runner that drives ``shardbus`` against it.

The commands reach the broker only as a user's would: ``--connection-string`` with the broker's port and
``--ca`` with the CA it created in its data directory. Nothing here opens the stores behind the broker's back
except to set up faults (a stopped partition) that no client can cause.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner, Result

from shardbus.cli_commands import app

_names = itertools.count()


@dataclass
class Cli:
    connection_string: str
    ca: str
    runner: CliRunner

    def __call__(self, *args: str, input: str | None = None, ok: bool = True) -> Result:
        """Run ``shardbus --connection-string ... --ca ... ARGS``; ``ok`` asserts the exit status 0 (or not)."""
        result = self.runner.invoke(
            app, ["--connection-string", self.connection_string, "--ca", self.ca, *args], input=input
        )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        if ok:
            assert result.exit_code == 0, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        else:
            assert result.exit_code != 0, f"expected a failure\nstdout: {result.stdout}"
        return result

    def json(self, *args: str, input: str | None = None) -> Any:
        return json.loads(self(*args, "--json", input=input).stdout)


@pytest.fixture(scope="module")
def cli(broker) -> Cli:
    return Cli(broker.connection_string, str(broker.ca_path), CliRunner())


@pytest.fixture
def name():
    """Factory: a new unique entity name."""

    def make(prefix: str = "e") -> str:
        return f"{prefix}{next(_names)}"

    return make
