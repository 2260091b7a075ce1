"""The partition interface is one table (``partition/handle.py``): the broker implements every operation with
the table's signature, the remote proxy and the worker's dispatch cover exactly the table, fault injection is no
part of it, and ``entity/`` depends on the interface, not on the broker."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from shardbus.cluster.remote import RemotePartition
from shardbus.cluster.worker import BROKER_CALLS, HANDLERS, Worker
from shardbus.partition.broker import PartitionBroker
from shardbus.partition.handle import OPERATIONS, Kind, PartitionHandle


def _parameters(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_broker_and_the_remote_proxy_have_each_operation_with_the_tables_signature(name):
    row = _parameters(getattr(PartitionHandle, name))
    assert _parameters(getattr(PartitionBroker, name)) == row
    assert _parameters(getattr(RemotePartition, name)) == row


def test_the_worker_answers_every_operation_that_crosses_the_wire_and_nothing_else_of_the_broker():
    wire = {name for name, op in OPERATIONS.items() if op.kind is not Kind.LOCAL}
    assert wire <= BROKER_CALLS | set(HANDLERS)
    assert wire >= BROKER_CALLS  # every broker method it calls by name is in the table


def test_the_table_names_its_kinds_and_hints():
    assert OPERATIONS["enqueue"].kind is Kind.WRITE and OPERATIONS["enqueue"].compact == (("items", "items"),)
    assert OPERATIONS["complete"].compact == (("tokens", "tokens"),)
    assert OPERATIONS["lock_messages"].reads and OPERATIONS["lock_messages"].kind is Kind.QUERY
    assert OPERATIONS["receive_deferred"].kind is Kind.QUERY_WRITE
    assert OPERATIONS["range_offsets"].result is tuple
    assert {n for n, op in OPERATIONS.items() if op.kind is Kind.LIFECYCLE} == {"start", "stop", "delete", "close"}


def test_fault_injection_is_no_part_of_the_production_interface():
    for where in (OPERATIONS, vars(PartitionBroker), vars(RemotePartition), BROKER_CALLS, HANDLERS):
        assert not [name for name in where if "inject" in name or "fault" in name]


def test_a_worker_refuses_extra_handlers_that_would_replace_an_operation(tmp_path):
    with pytest.raises(ValueError, match="enqueue"):
        Worker(tmp_path, "key", handlers={"enqueue": lambda conn, key: None})


def test_entities_do_not_import_the_broker():
    code = (
        "import sys\n"
        "import shardbus.entity.entity, shardbus.entity.receiver, shardbus.entity.sessions\n"
        "import shardbus.entity.transactions, shardbus.entity.forwarding\n"
        "print('shardbus.partition.broker' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
