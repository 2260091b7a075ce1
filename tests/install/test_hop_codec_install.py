"""The compiled hop codec (``shardbus/cluster/_hopcodec.pyx``) on a fresh install: ``pip install .`` of a fresh
``git clone`` (as ``scripts/run.sh`` runs it) builds it and the installed package imports it; without a working
C compiler the install still succeeds (the extension is optional) and ``cluster/wire.py`` runs its pure code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme_commands import INSTALL_TIMEOUT, clean_env, fresh_clone

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (Path(__file__).resolve().parents[2] / ".git").exists(),
    reason="needs git and a git checkout",
)

# What the installed package says of its codec: which module it runs, and one enqueue's items there and back.
PROBE = """
from shardbus.cluster import wire
from shardbus.model.message import Message
arrays, held = wire.held_item_arrays([(None, [(0, Message(b"x", message_id="m"))])])
items, messages = wire.held_items_of(wire.unpack_frame(wire.pack_frame(arrays)))
assert messages[0].body == b"x" and messages[0].message_id == "m"
print("COMPILED" if wire.COMPILED is not None else "PURE", wire.__file__)
"""


def install(tmp_path: Path, env: dict[str, str]) -> str:
    """``pip install .`` of a fresh clone into a new virtual environment; the probe's output."""
    clone = fresh_clone(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "."], cwd=clone, env=env, capture_output=True, text=True,
        timeout=INSTALL_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    probe = subprocess.run([python, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return probe.stdout


@pytest.mark.timeout(INSTALL_TIMEOUT + 120)
def test_a_fresh_install_builds_and_runs_the_compiled_codec(tmp_path: Path) -> None:
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here: the install is pure (the next test covers that)")
    out = install(tmp_path, clean_env())
    assert out.startswith("COMPILED") and "site-packages" in out, out


@pytest.mark.timeout(INSTALL_TIMEOUT + 120)
def test_without_a_compiler_the_install_succeeds_and_runs_the_pure_codec(tmp_path: Path) -> None:
    out = install(tmp_path, {**clean_env(), "CC": "/bin/false"})
    assert out.startswith("PURE"), out
