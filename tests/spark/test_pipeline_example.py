"""examples/pipeline end to end: the generator (official SDK) → the Spark job → Parquet totals and session alerts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shardbus.server import Broker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"pipeline_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pipeline_broker(tmp_path_factory):
    b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0, config=EXAMPLE / "config.json").start()
    yield b
    b.stop()


def test_pipeline_totals_and_alerts(spark, pipeline_broker, tmp_path):
    generator, job = load("generator"), load("job")
    conn = pipeline_broker.connection_string
    orders = generator.generate(conn, 3000)
    query = job.start(spark, conn, tmp_path / "out", tmp_path / "checkpoint")
    query.awaitTermination(120)
    query.stop()
    expected: dict[str, float] = {}
    for o in orders:
        expected[o["customer"]] = expected.get(o["customer"], 0) + o["amount"]
    got = job.totals(spark, tmp_path / "out")
    assert got.keys() == expected.keys()
    assert all(abs(got[c] - expected[c]) < 0.01 for c in expected)
    large = [o for o in orders if o["amount"] >= job.ALERT_AMOUNT]
    forwarded = list(pipeline_broker.namespace.browse("alerts"))
    assert sorted(str(m.message_id) for m in forwarded) == sorted(f"alert-{o['order_id']}" for o in large)
    assert {m.session_id for m in forwarded} == {o["customer"] for o in large}  # a session per customer
