"""PySpark registers any top-level ``pyspark_*`` module exposing ``DefaultSource`` by itself: this one makes
``format("shardbus")`` available in every session without a ``register`` call."""

from shardbus.spark import ShardbusDataSource as DefaultSource

__all__ = ["DefaultSource"]
