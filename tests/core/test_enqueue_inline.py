"""``PartitionBroker._stage_enqueue`` writes ``_new_entry`` out for the usual message (no time to live of its own,
none scheduled, a slot whose default time to live is none or "never"); every other message takes ``_new_entry``.
Both must give a message the same fields and its entry the same size, and the stored rows must read back the same."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from shardbus.model.message import Message, SubQueue
from shardbus.partition.broker import FAR_TTL_MS, PartitionBroker, PartitionConfig, SlotSettings
from shardbus.store.sqlite import SqliteStore

NOW = 1_700_000_000.0
LOCAL = 0xFFFFFFFFFF


def _messages() -> list[Message]:
    later = datetime.fromtimestamp(NOW + 3600, UTC)
    return [
        Message(b"plain", message_id="m1"),
        Message(b"keyed", message_id="m2", partition_key="k", application_properties={"a": 1}),
        Message(b"ttl", time_to_live=timedelta(seconds=30)),
        Message(b"scheduled", scheduled_enqueue_time=later),
        Message(b"resent", enqueued_sequence_number=5),
    ]


def _fields(m: Message) -> dict:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}


@pytest.mark.parametrize("default_ttl_ms", [None, FAR_TTL_MS + 1, 60_000])
def test_written_out_entry_is_new_entry(tmp_path, default_ttl_ms):
    settings = SlotSettings(path="q", default_ttl_ms=default_ttl_ms)
    config = PartitionConfig(path="q", partition_id=3, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, lambda: SqliteStore(tmp_path / "p.db"), lambda: NOW)
    broker.configure_slot(0, settings)
    broker.start()
    broker.create_slot(0, settings).result(30)
    try:
        sent = _messages()
        expected = copy.deepcopy(sent)
        seqs = [s & LOCAL for s in broker.enqueue([(None, [(0, m)]) for m in sent]).result(30)]
        floor = broker._ttl_floor(0)
        now = int(NOW * 1000)
        entries = broker._queues[(0, SubQueue.MAIN)].entries
        for m, general, seq in zip(sent, expected, seqs, strict=True):
            entry, row = broker._new_entry(0, seq, general, now, floor)  # the general path, for comparison
            assert _fields(m) == _fields(general)
            stored = entries.get(seq)
            if stored is not None:  # a scheduled message is not among the active ones
                assert stored.msg is m and stored.size == entry.size == len(row.data)
        broker._dues.clear()
        broker._expiries.clear()
    finally:
        broker.stop()
    broker.start()  # what the rows say, read back
    try:
        back = {m.body: m for m in broker.peek(0, SubQueue.MAIN, 1, 10)}
        for m in expected:
            if m.body in back:
                assert back[m.body].expires_at_ms == m.expires_at_ms
                assert back[m.body].sequence_number == m.sequence_number
    finally:
        broker.stop()
