"""bench/spark.py runs end to end with a tiny count (broker in a child process, this session's Spark)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "spark.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("shardbus_bench_spark", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def test_spark_bench_runs_every_path(spark):
    bench = load_bench()
    lines: list[str] = []
    results = bench.run(500, session=spark, out=lines.append)
    assert set(results) == {"batch-read", "stream-read", "batch-write"}
    assert all(len(runs) == 1 and runs[0][0] > 0 and runs[0][1] > 0 for runs in results.values())
    rows = [line for line in lines if "ratio=" in line]
    assert [line.split()[0] for line in rows] == ["batch-read", "stream-read", "batch-write"]
    for line in rows:
        assert "spark=" in line and "bare=" in line and "target " in line
    assert lines[-1].startswith("target spark >= 0.50 x bare")
    assert not spark.streams.active  # the bench's stream was stopped
