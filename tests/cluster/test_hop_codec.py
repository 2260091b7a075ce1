"""The compiled hop codec (``cluster/_hopcodec.pyx``) against the pure-Python code it replaces (``wire.PURE``): for
randomized messages, both return equal values and pack to equal bytes, both directions, including every case of a
lock reply's naming (held, not held, held but locked unlike the others); what the compiled code builds and drops
leaks no references; and ``SHARDBUS_PURE_HOP=1`` runs the pure code, through a real worker.

Where the extension was not built (``pip install`` without a C compiler: it is optional), the comparisons skip and
say so; under CI (``CI=true``) it must be there."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
import uuid
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.cluster import wire
from shardbus.model.message import BodyType, Message, MessageState

ROOT = Path(__file__).resolve().parents[2]
FIELDS = Message.__slots__

try:
    from shardbus.cluster import _hopcodec as compiled
except ImportError:  # not built (or refused this Message): wire.py runs its pure code
    compiled = None

needs_compiled = pytest.mark.skipif(
    compiled is None and os.environ.get("CI") != "true",
    reason="the compiled hop codec (shardbus/cluster/_hopcodec.pyx) is not built here: "
    "build it with `pip install -e .` (docs/performance.md, 'The hop codec, compiled')",
)
pure = wire.PURE


def test_the_compiled_codec_is_built_and_in_use_under_ci() -> None:
    if os.environ.get("CI") != "true":
        pytest.skip("checked under CI only (CI=true): elsewhere the extension may be absent, and wire.py runs pure")
    assert compiled is not None, "the compiled hop codec did not build or import"
    if os.environ.get("SHARDBUS_PURE_HOP", "") in ("", "0"):
        assert wire.COMPILED is compiled and wire.held_item_arrays is compiled.held_item_arrays


# --- randomized messages ------------------------------------------------------------------------------------------
_text = st.text(max_size=8)
_plain = st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), _text, st.binary(max_size=8), st.booleans())
_properties = st.one_of(
    st.none(), st.dictionaries(_text, st.one_of(_plain, st.dictionaries(_text, _plain)), max_size=4)
)
_maybe_text = st.one_of(st.none(), _text)
_maybe_int = st.one_of(st.none(), st.integers(0, 2**62))
_tokens = st.one_of(st.none(), st.uuids())
_times = st.one_of(st.none(), st.datetimes(timezones=st.just(UTC)).filter(lambda d: d.year > 1970))


@st.composite
def messages(draw: Any, broker_fields: bool = True) -> Message:
    """A message with every field at its default or not (each group of fields at its defaults half the time)."""
    m = Message(
        draw(st.one_of(st.binary(max_size=64), st.just(b""), st.just(b"x" * 1024))),
        message_id=draw(st.one_of(st.none(), _text, st.integers(0, 2**63), st.binary(max_size=16))),
        application_properties=draw(_properties),
        body_type=draw(st.sampled_from(BodyType)),
        wire_sections=draw(st.one_of(st.none(), st.binary(max_size=16))),
    )
    if draw(st.booleans()):  # the rare fields
        for name in ("session_id", "partition_key", "subject", "content_type", "to", "reply_to", "reply_to_session_id"):
            setattr(m, name, draw(_maybe_text))
        m.correlation_id = draw(st.one_of(st.none(), _text, st.integers(0, 99)))
        m.time_to_live = draw(st.one_of(st.none(), st.timedeltas(timedelta(0), timedelta(days=9))))
        m.scheduled_enqueue_time = draw(_times)
        m.annotations = draw(_properties)
        m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source = (draw(_maybe_text) for _ in "abc")
        m.forward_hops = draw(st.sampled_from((0, 0, 1, 3)))
        m.transfer_id = draw(_maybe_text)
    if broker_fields and draw(st.booleans()):
        m.sequence_number = draw(_maybe_int)
        m.enqueued_sequence_number = draw(st.one_of(st.just(m.sequence_number), _maybe_int))
        m.enqueued_time_ms, m.expires_at_ms, m.locked_until_ms = (draw(_maybe_int) for _ in "abc")
        m.delivery_count = draw(st.integers(0, 10))
        m.lock_token = draw(_tokens)
        m.state = draw(st.sampled_from(MessageState))
        m.partition_id = draw(st.one_of(st.none(), st.integers(0, 31)))
    return m


def fields(m: Message) -> tuple[Any, ...]:
    """Every field, types included (an enum member is not its int), and a lock token's ``is_safe``."""
    out = []
    for name in FIELDS:
        value = getattr(m, name)
        out.append((type(value), value))
    token = m.lock_token
    out.append(None if token is None else (token.int, token.is_safe))
    return tuple(out)


def same_messages(a: list[Message], b: list[Message]) -> None:
    assert [fields(m) for m in a] == [fields(m) for m in b]


def packed(value: Any) -> bytes:
    return wire.pack_frame([1, True, value, None])


def items(draw_messages: list[Message], copies: list[int]) -> list[tuple[Any, list[tuple[int, Message]]]]:
    """Items of the messages, each of one copy but those ``copies`` says (a topic's: several slots)."""
    out = []
    for i, m in enumerate(draw_messages):
        n = copies[i % len(copies)] if copies else 1
        out.append((f"dedup{i}" if i % 3 else None, [(slot, m.copy() if slot else m) for slot in range(n)]))
    return out


# --- both directions, equal values and equal bytes ------------------------------------------------------------
@needs_compiled
@settings(max_examples=150, deadline=None)
@given(st.lists(messages(broker_fields=False), max_size=6), st.lists(st.sampled_from((1, 1, 1, 2, 3)), max_size=3))
def test_an_enqueues_send_records_and_back(sent: list[Message], copies: list[int]) -> None:
    batch = items(sent, copies)
    arrays, held = compiled.held_item_arrays(batch)
    pure_arrays, pure_held = pure["held_item_arrays"](batch)
    assert arrays == pure_arrays and packed(arrays) == packed(pure_arrays)
    assert (held is None) == (pure_held is None) and (held is None or all(map(lambda a, b: a is b, held, pure_held)))
    frame = wire.unpack_frame(packed(arrays))[2]
    got, got_messages = compiled.held_items_of(frame)
    want, want_messages = pure["held_items_of"](wire.unpack_frame(packed(arrays))[2])
    assert [(key, [slot for slot, _ in c]) for key, c in got] == [(key, [slot for slot, _ in c]) for key, c in want]
    same_messages([m for _, c in got for _, m in c], [m for _, c in want for _, m in c])
    assert (got_messages is None) == (want_messages is None)
    if got_messages is not None:
        same_messages(got_messages, want_messages)
        assert all(m is c[0][1] for m, (_, c) in zip(got_messages, got, strict=True))


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(st.lists(messages(), max_size=6))
def test_a_lock_replys_compact_records_and_back(locked: list[Message]) -> None:
    records = compiled.records_of(locked)
    assert records == pure["records_of"](locked) and packed(records) == packed(pure["records_of"](locked))
    assert [compiled.record(m) for m in locked] == records == [pure["_record"](m) for m in locked]
    frame = wire.unpack_frame(packed(records))[2]
    same_messages(compiled.messages_of(frame), pure["messages_of"](frame))
    same_messages([compiled.from_record(v) for v in frame], pure["messages_of"](frame))


@st.composite
def lock_replies(draw: Any) -> tuple[list[Message], dict[int, Message], list[int]]:
    """A lock's messages (the worker's objects), what the worker holds of them, and how each is held: 0 not, 1 this
    very object, 2 another object under its sequence number; the lock fields alike for most, unlike for some."""
    n = draw(st.integers(0, 6))
    until, partition_id = draw(_maybe_int), draw(st.integers(0, 7))
    out, held, how = [], {}, []
    for i in range(n):
        m = draw(messages(broker_fields=False))
        m.sequence_number = 1000 + i
        m.enqueued_sequence_number = m.sequence_number if draw(st.integers(0, 4)) else 7
        m.enqueued_time_ms, m.expires_at_ms = draw(_maybe_int), draw(_maybe_int)
        m.delivery_count, m.lock_token = draw(st.integers(1, 5)), uuid.uuid4()
        m.locked_until_ms = until if draw(st.integers(0, 4)) else draw(_maybe_int)
        m.state = MessageState.ACTIVE if draw(st.integers(0, 4)) else draw(st.sampled_from(MessageState))
        m.partition_id = partition_id if draw(st.integers(0, 4)) else draw(st.integers(0, 7))
        kind = draw(st.sampled_from((0, 1, 1, 1, 2)))
        if kind == 1:
            held[m.sequence_number] = m
        elif kind == 2:
            held[m.sequence_number] = m.copy()
        out.append(m)
        how.append(kind)
    if draw(st.booleans()):
        held[99] = Message(b"never locked")  # held and not in this reply: stays held
    return out, held, how


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(lock_replies())
def test_a_locked_reply_names_what_is_held_alike_both_ways(reply: tuple[list[Message], dict, list[int]]) -> None:
    locked, held, _ = reply
    worker_c, worker_p = dict(held), dict(held)
    lock, records = compiled.named_records_of(locked, worker_c)
    pure_lock, pure_records = pure["named_records_of"](locked, worker_p)
    assert (lock, records) == (pure_lock, pure_records)
    assert packed([lock, records]) == packed([pure_lock, pure_records])
    assert worker_c == worker_p and all(worker_c[k] is worker_p[k] for k in worker_c)
    # the front end: the messages it sent, held by sequence number (its own objects: each side its own copies)
    sent = {seq: m for seq, m in held.items()}
    front_c = {seq: m.copy() for seq, m in sent.items()}
    front_p = {seq: front_c[seq].copy() for seq in sent}
    frame = wire.unpack_frame(packed([lock, records]))[2]
    got = compiled.locked_of(frame[0], frame[1], front_c)
    want = pure["locked_of"](frame[0], frame[1], front_p)
    same_messages(got, want)
    same_messages(list(front_c.values()), list(front_p.values()))
    assert front_c.keys() == front_p.keys()


@needs_compiled
@settings(max_examples=100, deadline=None)
@given(st.lists(st.uuids(), max_size=20))
def test_lock_tokens_both_ways(tokens: list[uuid.UUID]) -> None:
    data = compiled.token_bytes(tokens)
    assert data == pure["token_bytes"](tokens) == compiled.key_bytes([t.int for t in tokens])
    assert compiled.unpack_tokens(data) == pure["_unpack_tokens"](data) == [t.int for t in tokens]


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 2**128 - 1),
            st.integers(0, 2**40),
            st.sampled_from((0, 1, 255, 256, 2**30 - 1, 2**30, 2**60, 2**64 - 1, 2**64, 2**120, 2**128 - 1)),
        ),
        max_size=8,
    )
)
def test_lock_token_ints_of_every_size_both_ways(keys: list[int]) -> None:
    """A token's int and its 16 bytes (converted straight from and to the int's digits where their layout is
    known), small ints and those of every digit count."""
    data = compiled.key_bytes(keys)
    assert data == pure["key_bytes"](keys)
    back = compiled.unpack_tokens(data)
    assert back == pure["_unpack_tokens"](data) == keys
    assert [type(k) for k in back] == [int] * len(keys)
    tokens = [uuid.UUID(int=k) for k in keys]
    assert compiled.token_bytes(tokens) == data
    for m_token in tokens:  # one at a time too, as a record carries it
        m = Message(b"")
        m.lock_token = m_token
        record = compiled.record(m)
        assert record == pure["_record"](m)
        assert compiled.from_record(record).lock_token == m_token
    for bad in (-1, 2**128, -(2**100)):
        with pytest.raises(OverflowError):
            pure["key_bytes"]([bad])
        with pytest.raises(OverflowError):
            compiled.key_bytes([*keys, bad])


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from((2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, -33, -32, -129, -32769, 2**32)),
    st.floats(allow_nan=True),
    st.text(),  # lone surrogates too: both refuse them alike
    st.text(min_size=30, max_size=300),
    st.binary(max_size=300),
    st.uuids(),
    st.datetimes(timezones=st.just(UTC)),
    st.tuples(st.integers(), st.text()),
    st.sampled_from(BodyType),
)
_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=20), st.dictionaries(st.one_of(st.text(), st.integers()), children, max_size=20)
    ),
    max_leaves=60,
)


def _outcome(pack: Any, value: Any) -> Any:
    try:
        return pack(value)
    except Exception as exc:  # the same refusal (its type) from both
        return type(exc)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(_values)
def test_a_frame_packed_by_the_compiled_codec_is_msgpacks_to_the_byte(value: Any) -> None:
    """Plain values written by the compiled codec, any other by msgpack's packer in place: the same bytes as
    msgpack's alone (``wire._msgpack_pack``), or the same refusal."""
    assert _outcome(compiled.pack, value) == _outcome(wire._msgpack_pack, value)


@needs_compiled
def test_every_header_size_is_msgpacks() -> None:
    for n in (0, 15, 16, 31, 32, 255, 256, 65535, 65536, 70000):
        for value in ([1] * n, {i: None for i in range(n)}, b"x" * n, "y" * n, "\u00e9" * n):
            assert compiled.pack(value) == wire._msgpack_pack(value), (n, type(value))
    deep: list[Any] = []
    inner = deep
    for _ in range(400):  # past the compiled codec's own nesting: msgpack's packer takes the rest
        inner.append([])
        inner = inner[0]
    assert _outcome(compiled.pack, deep) == _outcome(wire._msgpack_pack, deep)


@needs_compiled
def test_what_the_compiled_code_does_not_take_goes_to_the_pure_code_or_fails_as_it_does() -> None:
    class Sub(Message):
        pass

    sub = Sub(b"sub", message_id="s")
    assert compiled.records_of([sub]) == pure["records_of"]([sub])
    assert compiled.held_item_arrays([(None, [(0, sub)])]) == pure["held_item_arrays"]([(None, [(0, sub)])])
    assert compiled.unpack_tokens(bytearray(16)) == pure["_unpack_tokens"](bytearray(16)) == [0]
    with pytest.raises(ValueError):
        pure["_unpack_tokens"](b"\x00" * 24)
    with pytest.raises(ValueError):
        compiled.unpack_tokens(b"\x00" * 24)
    unset = Message.__new__(Message)
    for f in (compiled.records_of, pure["records_of"]):
        with pytest.raises(AttributeError):
            f([unset])
    for f in (compiled.messages_of, pure["messages_of"]):
        with pytest.raises(ValueError):
            f([[1, 2, 3]])
        with pytest.raises(KeyError):
            f([[b"", None, None, 9, *([None] * 6), 0, None, None, None, None]])
    with pytest.raises(KeyError):
        compiled.locked_of([1, 0, 2], [[5, 1, 2, 3, b"\x00" * 16]], {})


def test_the_compiled_codec_is_written_for_this_wire_layout() -> None:
    """``wire.py``'s record layout (its field tuples and defaults) is the one the extension was compiled for: a
    change to one must change the other (else wire.py silently runs pure)."""
    if compiled is None:
        pytest.skip("the compiled hop codec is not built here")
    if os.environ.get("SHARDBUS_PURE_HOP", "") in ("", "0"):
        assert wire.COMPILED is compiled


# --- no leaks -----------------------------------------------------------------------------------------------------
@needs_compiled
def test_building_and_dropping_records_leaks_nothing() -> None:
    body, props, key = b"b" * 1024, {"k": "v"}, "dedup"
    sent = [Message(body, message_id="m", application_properties=props) for _ in range(100)]
    for i, m in enumerate(sent):
        m.sequence_number = m.enqueued_sequence_number = i
        m.lock_token, m.locked_until_ms, m.partition_id, m.delivery_count = uuid.uuid4(), 5, 1, 1
    big = b"x" * (2 << 20)
    shared = (
        body,
        props,
        key,
        big,
        BodyType.DATA,
        MessageState.ACTIVE,
        uuid.SafeUUID.unknown,
        sent[0],
        sent[0].lock_token,
    )
    batch = [(key, [(0, m)]) for m in sent]

    def rounds(n: int) -> None:
        for _ in range(n):
            arrays, _ = compiled.held_item_arrays(batch)
            compiled.held_items_of(arrays)
            records = compiled.records_of(sent)
            compiled.messages_of(records)
            held = {m.sequence_number: m for m in sent}
            lock, named = compiled.named_records_of(sent, held)
            compiled.locked_of(lock, named, {m.sequence_number: m for m in sent})
            compiled.unpack_tokens(compiled.token_bytes([m.lock_token for m in sent]))
            compiled.pack([7, key, 1.5, "enqueue", [arrays, key], (key,), props])  # a tuple: msgpack's packer
            compiled.pack([big])  # past the kept buffers' bound: its buffer is freed

    rounds(10)
    gc.collect()
    before = [sys.getrefcount(x) for x in shared]
    tracemalloc.start()
    rounds(10)
    gc.collect()
    first, _ = tracemalloc.get_traced_memory()
    rounds(1000)  # 10^5 messages each way
    gc.collect()
    last, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [sys.getrefcount(x) for x in shared] == before
    assert last - first < 64 * 1024, f"{last - first} bytes more after 10^5 messages"


# --- the fallback ---------------------------------------------------------------------------------------------------
def test_pure_when_asked() -> None:
    """Run by the next test in a process of its own with ``SHARDBUS_PURE_HOP=1``."""
    if os.environ.get("SHARDBUS_PURE_HOP") != "1":
        pytest.skip("runs in a child process with SHARDBUS_PURE_HOP=1 (test_the_pure_code_serves_a_real_worker)")
    assert wire.COMPILED is None
    assert wire.held_item_arrays is pure["held_item_arrays"] and wire.locked_of is pure["locked_of"]
    assert wire.messages_of is pure["messages_of"] and wire._unpack_tokens is pure["_unpack_tokens"]
    assert wire._pack is wire._msgpack_pack


def test_the_pure_code_serves_a_real_worker(tmp_path: Path) -> None:
    """``SHARDBUS_PURE_HOP=1``: the pure codec, through real sockets to a worker (tests/cluster/test_held_lock_replies
    and test_lock_records run in a child process)."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, SHARDBUS_PURE_HOP="1", PYTHONPATH=path)
    here = "tests/cluster/"
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            f"{here}test_hop_codec.py::test_pure_when_asked", f"{here}test_held_lock_replies.py",
            f"{here}test_lock_records.py", f"{here}test_wire_codec.py",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "runs in a child process" not in run.stdout, run.stdout[-2000:]
