"""GroupCommitter: lingering settlements share one batch and one future; everything else keeps its own."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shardbus.store.committer import GroupCommitter


class RecordingStore:
    """Just ``apply``: keeps every batch it is given, or fails them all when told to."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.synced: list[bool] = []  # each batch's ``sync``
        self.fail = False

    def apply(self, ops: list[Any], sync: bool = True) -> None:
        if self.fail:
            raise OSError("disk full")
        self.batches.append(list(ops))
        self.synced.append(sync)


def _committer(store: RecordingStore) -> GroupCommitter:
    return GroupCommitter(store, lambda exc: RuntimeError(f"store failed: {exc}"))  # type: ignore[arg-type]


def test_lingering_writes_share_one_batch_and_one_future() -> None:
    store = RecordingStore()
    committer = _committer(store)
    first_ops = [("delete", 0, [1])]
    first = committer.submit(first_ops, linger=30.0)
    second = committer.submit([("delete", 0, [2])], linger=30.0)
    third = committer.submit([("delete", 0, [3])], linger=30.0)
    assert second is first and third is first
    assert not first.done()  # still lingering
    assert committer.wait_idle(5)
    assert first.result(5) is None
    assert store.batches == [[("delete", 0, [1]), ("delete", 0, [2]), ("delete", 0, [3])]]
    assert first_ops == [("delete", 0, [1])]  # the caller's list is not the one that grew


def test_writes_that_must_not_wait_or_report_keep_their_own_future() -> None:
    store = RecordingStore()
    committer = _committer(store)
    lingering = committer.submit([("delete", 0, [1])], linger=30.0)
    reported = committer.submit([("delete", 0, [2])], on_commit=lambda: "visible", linger=30.0)
    after = committer.submit([("delete", 0, [3])], linger=30.0)
    urgent = committer.submit([("put", 0, [4])])
    assert len({id(lingering), id(reported), id(after), id(urgent)}) == 4
    assert reported.result(5) == "visible"
    for future in (lingering, after, urgent):
        assert future.result(5) is None
    assert committer.wait_idle(5)
    applied = [op for batch in store.batches for op in batch]
    assert applied == [("delete", 0, [1]), ("delete", 0, [2]), ("delete", 0, [3]), ("put", 0, [4])]


def test_a_failed_batch_fails_every_write_that_shared_it() -> None:
    store = RecordingStore()
    store.fail = True
    committer = _committer(store)
    futures = [committer.submit([("delete", 0, [i])], linger=30.0) for i in range(3)]
    assert committer.wait_idle(5)
    for future in futures:
        with pytest.raises(RuntimeError, match="disk full"):
            future.result(5)
    store.fail = False
    later = committer.submit([("delete", 0, [9])], linger=30.0)
    assert later is not futures[0]  # a new batch, a new future
    assert committer.wait_idle(5)
    assert later.result(5) is None


def test_lingering_writes_alone_skip_the_sync_and_ride_along_a_synced_batch() -> None:
    store = RecordingStore()
    committer = _committer(store)
    committer.submit([("delete", 0, [1])], linger=30.0)
    assert committer.wait_idle(5)
    committer.submit([("delete", 0, [2])], linger=30.0)
    committer.submit([("put", 0, [3])]).result(5)  # a send: ends the linger, and its batch is synced
    assert committer.wait_idle(5)
    assert store.batches == [[("delete", 0, [1])], [("delete", 0, [2]), ("put", 0, [3])]]
    assert store.synced == [False, True]


def test_waiting_for_a_lingering_write_ends_its_linger() -> None:
    store = RecordingStore()
    committer = _committer(store)
    future = committer.submit([("delete", 0, [1])], linger=30.0)
    assert future.result(5) is None  # not 30 s: the Python API's complete() waits like this
    assert store.batches == [[("delete", 0, [1])]]
    assert store.synced == [False]  # still a batch of lingering writes alone


def test_a_callback_alone_lets_a_write_linger_and_hurry_ends_it() -> None:
    store = RecordingStore()
    committer = _committer(store)
    future = committer.submit([("delete", 0, [1])], linger=30.0)
    called = threading.Event()
    future.add_done_callback(lambda f: called.set())  # the AMQP endpoint's failure log: nobody waits
    assert not called.wait(0.3) and store.batches == []
    future.hurry()  # a worker whose front end waits for the reply
    assert called.wait(5)
    assert store.batches == [[("delete", 0, [1])]]
