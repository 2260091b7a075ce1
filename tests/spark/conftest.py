"""One real local SparkSession for the whole test run (fast settings from SPARK_DATASOURCE.md) and a real
shardbus broker on a free port; Spark's Python workers reach it over TCP like any client."""

from __future__ import annotations

import itertools
import os
import sys

import pytest

from shardbus.client import OutgoingMessage, ShardbusClient

_names = itertools.count()


@pytest.fixture(scope="session")
def spark():
    pyspark = pytest.importorskip("pyspark")
    del pyspark
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only: never the machine's other addresses
    session = (
        SparkSession.builder.master("local[2,2]")  # a failed task is tried once more, as on a cluster
        .appName("shardbus-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from shardbus.spark import register

    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def ns(broker):
    return broker.namespace


@pytest.fixture(scope="module")
def client(conn_str):
    with ShardbusClient(conn_str) as c:
        yield c


@pytest.fixture
def name():
    """A fresh entity name."""
    return f"e{next(_names)}"


@pytest.fixture(scope="module")
def fill(client):
    """Factory: send ``count`` messages with ids m<start>.. and a body naming the id; returns the ids."""

    def send(entity: str, count: int, start: int = 0, **fields) -> list[str]:
        ids = [f"m{i}" for i in range(start, start + count)]
        messages = [
            OutgoingMessage(body=f"body-{i}".encode(), message_id=i, application_properties={"n": k}, **fields)
            for k, i in enumerate(ids, start)
        ]
        client.send(entity, messages)
        return ids

    return send
