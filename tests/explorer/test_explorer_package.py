"""A non-editable install carries the explorer's templates and static files (setuptools package data)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "shardbus" / "http" / "explorer"


def test_the_wheel_carries_every_template_and_static_file(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("shardbus-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = [p for folder in ("templates", "static") for p in (PACKAGE / folder).iterdir() if p.is_file()]
    assert len(wanted) >= 9
    missing = [str(p.relative_to(ROOT / "src")) for p in wanted if str(p.relative_to(ROOT / "src")) not in names]
    assert not missing
