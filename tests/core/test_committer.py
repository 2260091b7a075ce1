"""GroupCommitter: lingering settlements share one batch and one future; everything else keeps its own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shardbus.model.errors import PartitionFull
from shardbus.store import committer as committer_module
from shardbus.store.base import StoreFull
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


def test_a_lingering_store_holds_no_commit_thread() -> None:
    """Sixteen stores' settlements linger while a send comes: with one pool thread, the send is not held up by
    the lingering stores (they wait on a deadline, not on a sleeping pool thread)."""
    pool = ThreadPoolExecutor(max_workers=1)
    stores = [RecordingStore() for _ in range(17)]
    committers = [
        GroupCommitter(store, lambda exc: RuntimeError(str(exc)), executor=pool)  # type: ignore[arg-type]
        for store in stores
    ]
    lingering = [c.submit([("delete", 0, [1])], linger=30.0) for c in committers[:16]]
    started = time.monotonic()
    assert committers[16].submit([("put", 0, [2])]).result(5) is None
    assert time.monotonic() - started < 5
    assert not any(f.done() for f in lingering) and all(s.batches == [] for s in stores[:16])
    for c in committers:
        assert c.wait_idle(5)
    assert all(s.batches == [[("delete", 0, [1])]] and s.synced == [False] for s in stores[:16])
    pool.shutdown()


def test_a_lingering_write_is_written_at_its_deadline_on_its_own() -> None:
    store = RecordingStore()
    committer = _committer(store)
    future = committer.submit([("delete", 0, [1])], linger=0.05)
    called = threading.Event()
    future.add_done_callback(lambda f: called.set())  # nobody waits: only the deadline writes it
    assert called.wait(5)
    committer.submit([("delete", 0, [2])], linger=0.05).add_done_callback(lambda f: called.clear())
    deadline = time.monotonic() + 5
    while called.is_set() and time.monotonic() < deadline:  # a second linger after the first is written
        time.sleep(0.01)
    assert not called.is_set()
    assert store.batches == [[("delete", 0, [1])], [("delete", 0, [2])]] and store.synced == [False, False]


class FillingStore(RecordingStore):
    """Raises StoreFull (nothing written) while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self.attempts = 0

    def apply(self, ops: list[Any], sync: bool = True) -> None:
        self.attempts += 1
        if self.full:
            raise StoreFull("database or disk is full")
        super().apply(ops, sync)


def _full_committer(store: FillingStore, failures: list[BaseException] | None = None) -> GroupCommitter:
    def on_failure(exc: BaseException) -> BaseException:
        if failures is not None:
            failures.append(exc)
        return RuntimeError(f"store failed: {exc}")

    return GroupCommitter(store, on_failure, on_full=lambda exc: PartitionFull(str(exc)))  # type: ignore[arg-type]


def test_a_full_store_refuses_sends_and_keeps_the_rest_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer_module, "FULL_RETRY", 0.2)
    store = FillingStore()
    failures: list[BaseException] = []
    committer = _full_committer(store, failures)
    store.full = True
    send = committer.submit([("put", 0, [1])], on_commit=lambda: "visible", refusable=True)
    with pytest.raises(PartitionFull):
        send.result(5)
    assert committer.refusing
    settle = committer.submit([("delete", 0, [7])], linger=0.001)
    plain = committer.submit([("session_state", 0, "s", b"x")])  # its caller waits for the write
    assert settle.result(5) is None  # a lingering write is done for its caller; written later
    committer.retry_due()  # not due yet: nothing tried
    attempts = store.attempts
    time.sleep(0.3)
    committer.retry_due()  # due: tried, still full, kept again
    assert _eventually(lambda: store.attempts > attempts)
    assert not plain.done()
    store.full = False
    time.sleep(0.3)
    committer.retry_due()
    assert plain.result(5) is None
    assert not committer.refusing and failures == []
    assert [op for batch in store.batches for op in batch] == [("delete", 0, [7]), ("session_state", 0, "s", b"x")]
    after = committer.submit([("put", 0, [2])], on_commit=lambda: "visible", refusable=True)
    assert after.result(5) == "visible"


def test_too_many_waiting_writes_fail_as_any_store_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer_module, "MAX_KEPT_OPS", 2)
    store = FillingStore()
    failures: list[BaseException] = []
    committer = _full_committer(store, failures)
    store.full = True
    waiting = committer.submit([("delete", 0, [1]), ("delete", 0, [2]), ("delete", 0, [3])])
    with pytest.raises(RuntimeError):
        waiting.result(5)
    assert len(failures) == 1 and isinstance(failures[0], StoreFull)


def test_giving_up_on_a_full_store_fails_what_queued_behind_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes queued while the kept ones were being tried fail with them: written alone, a counts op among them
    would land on a store that lacks the writes it assumes (kept counts drifting from the rows after a reload)."""
    import threading

    monkeypatch.setattr(committer_module, "MAX_KEPT_OPS", 3)
    monkeypatch.setattr(committer_module, "FULL_RETRY", 0.05)
    gate, entered = threading.Event(), threading.Event()

    class GatedStore(FillingStore):
        def apply(self, ops: list[Any], sync: bool = True) -> None:
            entered.set()
            gate.wait(5)
            super().apply(ops, sync)

    store = GatedStore()
    failures: list[BaseException] = []
    committer = _full_committer(store, failures)
    store.full = True
    kept = committer.submit([("delete", 0, [1]), ("delete", 0, [2]), ("delete", 0, [3])])
    assert entered.wait(5)  # the kept batch is being written: what comes now queues behind it
    behind = committer.submit([("counts", 0, -3)])  # queued while the kept batch is being tried
    lingering = committer.submit([("delete", 0, [4])], linger=1.0)
    gate.set()
    for future in (kept, behind, lingering):
        with pytest.raises(RuntimeError):
            future.result(5)
    assert len(failures) == 1 and isinstance(failures[0], StoreFull)
    store.full = False
    committer.submit([("create_slot", 9)]).result(5)  # the store takes writes again: only what came after
    assert store.batches == [[("create_slot", 9)]]
    assert committer.wait_idle(5)


def test_closing_tries_a_full_store_once_more_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer_module, "FULL_RETRY", 60.0)
    store = FillingStore()
    failures: list[BaseException] = []
    committer = _full_committer(store, failures)
    store.full = True
    plain = committer.submit([("create_slot", 3)])
    assert _eventually(lambda: committer.refusing)
    assert committer.wait_idle(5)  # not 60 s: closing does not wait for the retry
    with pytest.raises(RuntimeError):
        plain.result(1)


def _eventually(check: Any, limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def test_after_answers_runs_once_every_future_of_its_batch_resolved() -> None:
    """What an ``on_commit`` defers with ``after_answers`` (a partition waking its receivers) runs after the whole
    batch's callers are answered, so their answers reach the event loop first; a failing one stops nothing."""
    store = RecordingStore()
    gate = threading.Event()
    committer = GroupCommitter(
        store,  # type: ignore[arg-type]
        lambda exc: RuntimeError(str(exc)),
        executor=ThreadPoolExecutor(1),
    )
    blocker = committer.submit([("put", 0, [0])], on_commit=gate.wait)  # holds the drain: the next two batch up
    seen: list[tuple[str, list[bool]]] = []
    futures: list[Any] = []

    def broken() -> None:
        raise RuntimeError("a bug in a listener")

    def visible(name: str) -> str:
        committer.after_answers(broken)
        committer.after_answers(lambda: seen.append((name, [f.done() for f in futures])))
        return name

    futures.append(committer.submit([("put", 0, [1])], on_commit=lambda: visible("a")))
    futures.append(committer.submit([("put", 0, [2])], on_commit=lambda: visible("b")))
    gate.set()
    assert blocker.result(5) is True
    assert [f.result(5) for f in futures] == ["a", "b"]
    assert committer.wait_idle(5)
    assert seen == [("a", [True, True]), ("b", [True, True])]  # both answered before either ran
    later = committer.submit([("put", 0, [3])], on_commit=lambda: visible("c"))
    assert later.result(5) == "c" and committer.wait_idle(5)
    assert seen[-1][0] == "c"  # the failing one did not stop the drain


class ThreadRecordingStore(RecordingStore):
    """Also the name of the thread each batch was written on; ``hold`` keeps the first batch's write waiting.
    Its writes stay on this host, as SQLite's do (``LOCAL_WRITES``), unless ``local`` is False."""

    def __init__(self, local: bool = True) -> None:
        self.LOCAL_WRITES = local
        super().__init__()
        self.threads: list[str] = []
        self.hold: threading.Event | None = None
        self.writing = threading.Event()

    def apply(self, ops: list[Any], sync: bool = True) -> None:
        self.threads.append(threading.current_thread().name)
        self.writing.set()
        if self.hold is not None and len(self.threads) == 1:
            assert self.hold.wait(5)
        super().apply(ops, sync)


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=2, thread_name_prefix="test-commit")
        self.tasks = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.tasks += 1
        return super().submit(fn, *args, **kwargs)


def test_lingering_writes_alone_are_written_on_the_deadline_thread() -> None:
    """At its deadline a batch of lingering writes alone (unsynced) is written by the timer thread itself: no
    pool thread is woken for a settlement commit."""
    pool = CountingPool()
    store = ThreadRecordingStore()
    committer = GroupCommitter(store, lambda exc: RuntimeError(str(exc)), executor=pool)  # type: ignore[arg-type]
    done = threading.Event()
    committer.submit([("delete", 0, [1])], linger=0.02).add_done_callback(lambda f: done.set())
    committer.submit([("delete", 0, [2])], linger=0.02)
    assert done.wait(5)
    assert store.batches == [[("delete", 0, [1]), ("delete", 0, [2])]] and store.synced == [False]
    assert store.threads == ["shardbus-linger"] and pool.tasks == 0
    pool.shutdown()


def test_a_send_that_comes_while_the_deadline_thread_writes_goes_to_the_pool() -> None:
    """A send submitted while the timer thread writes a lingering batch is written after it, synced, by a pool
    thread: the timer thread never waits for an fsync, and the order holds."""
    pool = CountingPool()
    store = ThreadRecordingStore()
    store.hold = threading.Event()
    committer = GroupCommitter(store, lambda exc: RuntimeError(str(exc)), executor=pool)  # type: ignore[arg-type]
    committer.submit([("delete", 0, [1])], linger=0.02)
    assert store.writing.wait(5)  # the deadline came: the timer thread is writing the lingering batch
    send = committer.submit([("put", 0, [2])])
    store.hold.set()
    assert send.result(5) is None
    assert committer.wait_idle(5)
    assert store.batches == [[("delete", 0, [1])], [("put", 0, [2])]] and store.synced == [False, True]
    assert store.threads[0] == "shardbus-linger" and store.threads[1].startswith("test-commit")
    assert pool.tasks == 1
    pool.shutdown()


def test_a_remote_stores_lingering_writes_go_to_the_pool() -> None:
    """A store whose unsynced write leaves the host (PostgreSQL: a round trip) is never written on the timer
    thread, which every store's deadline shares."""
    pool = CountingPool()
    store = ThreadRecordingStore(local=False)
    committer = GroupCommitter(store, lambda exc: RuntimeError(str(exc)), executor=pool)  # type: ignore[arg-type]
    done = threading.Event()
    committer.submit([("delete", 0, [1])], linger=0.02).add_done_callback(lambda f: done.set())
    assert done.wait(5)
    assert store.synced == [False] and store.threads[0].startswith("test-commit") and pool.tasks == 1
    pool.shutdown()
