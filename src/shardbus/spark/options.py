"""The connector's options (Spark passes every option as a string), offsets, and the per-process client pool."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..amqp.transport import AmqpClientError
from ..client import ClientError, ShardbusClient

log = logging.getLogger("shardbus.spark")
T = TypeVar("T")

# Conditions worth retrying inside a task: the partition is down for now, or the broker is busy.
TRANSIENT_CONDITIONS = frozenset({"com.microsoft:server-busy", "com.microsoft:timeout", "amqp:resource-limit-exceeded"})


def _flag(value: str) -> bool:
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


@dataclass(frozen=True, slots=True)
class Options:
    connection_string: str
    entity_path: str
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    max_records_per_trigger: int | None = None
    max_records_per_partition: int = 100_000  # sequence numbers per Spark input partition
    fail_on_data_loss: bool = True
    timeout: float = 30.0
    page_size: int = 5000
    retries: int = 3
    id_prefix: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        """Spark's options (case-insensitive keys): ``connectionString`` and ``entityPath`` are required."""
        opts = {k.lower(): v for k, v in options.items()}

        def need(key: str) -> str:
            value = opts.get(key.lower())
            if not value:
                raise ValueError(f"The shardbus source needs the option '{key}'.")
            return value

        def number(key: str, default: Any, kind: Callable[[str], Any] = int) -> Any:
            value = opts.get(key.lower())
            if value is None:
                return default
            try:
                result = kind(value)
            except ValueError:
                raise ValueError(f"Option '{key}' must be a number, got {value!r}.") from None
            if result <= 0:
                raise ValueError(f"Option '{key}' must be positive, got {value!r}.")
            return result

        try:
            fail_on_data_loss = _flag(opts.get("failondataloss", "true"))
        except ValueError as exc:
            raise ValueError(f"Option 'failOnDataLoss': {exc}") from None
        return cls(
            connection_string=need("connectionString"),
            entity_path=need("entityPath"),
            starting_offsets=opts.get("startingoffsets", "earliest"),
            ending_offsets=opts.get("endingoffsets", "latest"),
            max_records_per_trigger=number("maxRecordsPerTrigger", None),
            max_records_per_partition=number("maxRecordsPerPartition", 100_000),
            fail_on_data_loss=fail_on_data_loss,
            timeout=number("timeout", 30.0, float),
            page_size=number("pageSize", 5000),
            retries=int(opts.get("retries", "3")),
            id_prefix=opts.get("idprefix", ""),
        )


# ---------------------------------------------------------------------------------------------------- offsets
def canonical(offsets: Mapping[Any, int]) -> dict[str, int]:
    """Offsets as Spark must see them: string keys, sorted, so equal offsets are equal JSON text."""
    return dict(sorted((str(p), int(v)) for p, v in offsets.items()))


def by_partition(offsets: Mapping[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in offsets.items()}


def parse_offsets(spec: str, name: str) -> dict[int, int] | str:
    """``earliest`` / ``latest`` as such, or JSON ``{"<partition>": sequence number}`` (-2 earliest, -1 latest)."""
    if spec.strip().lower() in ("earliest", "latest"):
        return spec.strip().lower()
    try:
        value = json.loads(spec)
        return {int(k): int(v) for k, v in value.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(
            f"Option '{name}' must be earliest, latest or JSON like {{\"0\": 42}}, got {spec!r}."
        ) from None


# ------------------------------------------------------------------------------------------------ client pool
_clients: dict[tuple[str, float], ShardbusClient] = {}
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def client_for(options: Options) -> ShardbusClient:
    """One client (one connection) per process and connection string, kept across tasks: Spark reuses its
    Python workers, and a reader or writer must stay picklable, so it cannot hold the client itself."""
    global _clients_pid
    with _clients_lock:
        if os.getpid() != _clients_pid:  # a forked worker must not share its parent's sockets
            _clients.clear()
            _clients_pid = os.getpid()
        key = (options.connection_string, options.timeout)
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = ShardbusClient(options.connection_string, timeout=options.timeout)
        return client


def retrying(options: Options, what: str, call: Callable[[], T]) -> T:
    """Run ``call``, retrying transient failures (partition briefly down, broken connection) with backoff."""
    for attempt in range(options.retries + 1):
        try:
            return call()
        except ClientError as exc:
            if exc.condition not in TRANSIENT_CONDITIONS or attempt == options.retries:
                raise
            error: Exception = exc
        except (AmqpClientError, TimeoutError, ConnectionError, OSError) as exc:
            if attempt == options.retries:
                raise
            error = exc
        delay = 0.5 * 2**attempt
        log.warning("%s failed (%s); retrying in %.1f s", what, error, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")
