"""AMQP 1.0 composite types: performatives, SASL frames, terminus, error, delivery states, transactions.

Each composite is a slotted dataclass whose fields follow the spec's field order. A small per-class spec
(``_define``) gives every field its wire encoder, the type check applied when decoding, and a converter for
nested composites; the generic ``encode_into`` / ``from_fields`` below use it, so no class repeats any
codec logic.

Encoding writes ``0x00 0x53 <code>`` followed by a list, omitting trailing fields that are null or equal to
their spec default. Decoding accepts shorter lists (missing fields take their defaults), extra trailing
fields (ignored, for forward compatibility), symbolic descriptors, and nulls for fields with defaults. A wrong
wire type or a missing mandatory field raises ``InvalidField`` (``amqp:invalid-field``). ``decode_performative``
first tries a generated fast decoder for transfer, disposition and flow (the frames every delivery costs), which
takes only their common encodings and leaves everything else, malformed input included, to the generic path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple

from . import codec
from .codec import DecodeError, e_any, e_binary, e_symbol, e_symbol_map, e_symbols, e_uint
from .types import Described, Symbol, UInt

__all__ = [
    "COMPOSITES",
    "DESCRIPTOR_CODES",
    "RECEIVER",
    "SENDER",
    "Accepted",
    "Attach",
    "Begin",
    "Close",
    "Composite",
    "Coordinator",
    "Declare",
    "Declared",
    "DeliveryState",
    "Detach",
    "Discharge",
    "Disposition",
    "End",
    "Error",
    "Flow",
    "InvalidField",
    "Modified",
    "Open",
    "Outcome",
    "RcvSettleMode",
    "Received",
    "Rejected",
    "Released",
    "SaslChallenge",
    "SaslCode",
    "SaslInit",
    "SaslMechanisms",
    "SaslOutcome",
    "SaslResponse",
    "SndSettleMode",
    "Source",
    "Target",
    "TransactionalState",
    "Transfer",
    "decode_composite",
    "decode_performative",
    "decode_performative_generic",
    "encode_performative",
]

SENDER = False
"""``role`` value of a sending link end."""
RECEIVER = True
"""``role`` value of a receiving link end."""


class SndSettleMode:
    """Sender settle modes (ubyte)."""

    UNSETTLED = 0
    SETTLED = 1
    MIXED = 2


class RcvSettleMode:
    """Receiver settle modes (ubyte)."""

    FIRST = 0
    SECOND = 1


class SaslCode:
    """sasl-outcome codes."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


class InvalidField(DecodeError):
    """A well-formed composite with a field of the wrong type or a missing mandatory field."""


class _Kind(NamedTuple):
    encode: Callable[[bytearray, Any], None]
    types: tuple[type, ...] | None  # isinstance check on decode (None = anything)
    convert: Callable[[Any], Any] | None = None


def _e_bool(out: bytearray, v: Any) -> None:
    out.append(0x41 if v else 0x42)


def _to_symbols(v: Any) -> Any:
    if isinstance(v, str):
        return [Symbol(v)]
    if isinstance(v, list):
        return v
    raise InvalidField("expected symbol or symbol array")


_INT = (int,)
UINT = _Kind(e_uint, _INT)
USHORT = _Kind(codec.e_ushort, _INT)
UBYTE = _Kind(codec.e_ubyte, _INT)
ULONG = _Kind(codec.e_ulong, _INT)
BOOL = _Kind(_e_bool, (bool,))
BINARY = _Kind(e_binary, (bytes,))
STRING = _Kind(codec.e_string, (str,))
SYMBOL = _Kind(e_symbol, (str,))
SYMBOLS = _Kind(e_symbols, None, _to_symbols)
FIELDS = _Kind(e_symbol_map, (dict,))
MAP = _Kind(codec.e_map, (dict,))
ANY = _Kind(e_any, None)
TIMESTAMP = _Kind(codec.e_timestamp, _INT)


class Composite:
    """Base of all described-list composites. Subclasses are slotted dataclasses set up by ``_define``."""

    __slots__ = ()
    CODE: ClassVar[int]
    NAME: ClassVar[str]
    _ENCODERS: ClassVar[tuple[Callable[[bytearray, Any], None], ...]]
    _DEFAULTS: ClassVar[tuple[Any, ...]]
    _GET: ClassVar[Callable[[Any], tuple[Any, ...]]]
    _NFIELDS: ClassVar[int]
    _NONNULL_DEFAULTS: ClassVar[tuple[tuple[int, Any], ...]]
    _MANDATORY: ClassVar[tuple[int, ...]]
    _TRIM_DEFAULTS: ClassVar[bool] = True
    _MIN_LEN: ClassVar[int] = 0
    # Built from a decoded field list (short lists, nulls for defaults and extra fields accepted); generated per
    # class by ``_define``.
    from_fields: ClassVar[Callable[[list[Any]], Any]]

    def encode_into(self, out: bytearray) -> None:
        """Append ``0x00 0x53 CODE`` + the field list, trailing nulls/defaults omitted."""
        values = self._GET(self)
        defaults = self._DEFAULTS
        n = len(values)
        while n > self._MIN_LEN:
            v = values[n - 1]
            d = defaults[n - 1]
            if v is None or (self._TRIM_DEFAULTS and v == d and (v.__class__ is bool) == (d.__class__ is bool)):
                n -= 1
            else:
                break
        if n == 0:
            out += bytes((0x00, 0x53, self.CODE, 0x45))
            return
        body = bytearray()
        encs = self._ENCODERS
        for i in range(n):
            v = values[i]
            if v is None:
                body.append(0x40)
            else:
                encs[i](body, v)
        out += bytes((0x00, 0x53, self.CODE))
        codec._finish_compound(out, body, n, 0xC0, 0xD0)

    def encode(self) -> bytes:
        """The encoded described list."""
        out = bytearray()
        self.encode_into(out)
        return bytes(out)


COMPOSITES: dict[int, type[Composite]] = {}
"""Descriptor code -> class for every composite defined here (and in message.py)."""
DESCRIPTOR_CODES: dict[str, int] = {}
"""Symbolic descriptor name (``amqp:open:list``) -> numeric code."""


def _define(cls: Any, code: int, name: str, kinds: Sequence[_Kind], mandatory: Sequence[int] = ()) -> None:
    """Attach the wire spec to a composite dataclass and register it."""
    flds = dataclasses.fields(cls)
    if len(flds) != len(kinds):
        raise TypeError(f"{cls.__name__}: {len(flds)} fields but {len(kinds)} kinds")
    defaults = tuple(None if f.default is dataclasses.MISSING else f.default for f in flds)
    cls.CODE = code
    cls.NAME = name
    cls._ENCODERS = tuple(k.encode for k in kinds)
    cls._DEFAULTS = defaults
    names = [f.name for f in flds]
    if len(names) > 1:
        cls._GET = attrgetter(*names)
    elif names:
        get1 = attrgetter(names[0])
        cls._GET = staticmethod(lambda self: (get1(self),))
    else:
        cls._GET = staticmethod(lambda self: ())
    cls._NFIELDS = len(flds)
    cls._NONNULL_DEFAULTS = tuple((i, d) for i, d in enumerate(defaults) if d is not None)
    cls._MANDATORY = tuple(mandatory)
    cls._MIN_LEN = max(mandatory) + 1 if mandatory else 0  # mandatory fields are never trimmed
    cls.from_fields = classmethod(_make_from_fields(cls, kinds))  # type: ignore[method-assign]
    COMPOSITES[code] = cls
    DESCRIPTOR_CODES[name] = code


def _make_from_fields(cls: Any, kinds: Sequence[_Kind]) -> Callable[..., Any]:
    """``from_fields`` unrolled for one class: the generic loops cost several times more on the transfers and
    message sections every delivery decodes. Same checks, same order, same errors."""
    n = cls._NFIELDS
    names = [f"f{i}" for i in range(n)]
    env: dict[str, Any] = {"InvalidField": InvalidField, "_INT": _INT}
    lines = ["def from_fields(cls, fields):", "    count = len(fields)", f"    if count != {n}:"]
    lines += [f"        fields = fields[:{n}] if count > {n} else fields + [None] * ({n} - count)"]
    if n:
        lines.append(f"    {', '.join(names)}{',' if n == 1 else ''} = fields")
    for i, d in cls._NONNULL_DEFAULTS:
        env[f"d{i}"] = d
        lines.append(f"    if f{i} is None:\n        f{i} = d{i}")
    for i, kind in enumerate(kinds):
        if kind.types is None:
            continue
        env[f"t{i}"] = kind.types
        bad = f"not isinstance(f{i}, t{i})" + (f" or f{i}.__class__ is bool" if kind.types is _INT else "")
        lines.append(f"    if f{i} is not None and ({bad}):")
        lines.append(f"        raise InvalidField(f'{{cls.NAME}} field {i} has wrong type {{type(f{i}).__name__}}')")
    for i, kind in enumerate(kinds):
        if kind.convert is not None:
            env[f"c{i}"] = kind.convert
            lines.append(f"    if f{i} is not None:\n        f{i} = c{i}(f{i})")
    for i in cls._MANDATORY:
        missing = f"count <= {i} or f{i} is None"
        lines.append(f"    if {missing}:\n        raise InvalidField(f'{{cls.NAME}} is missing mandatory field {i}')")
    lines.append(f"    return cls({', '.join(names)})")
    exec("\n".join(lines), env)
    return env["from_fields"]


def _code_of(descriptor: Any) -> int | None:
    if isinstance(descriptor, str):
        return DESCRIPTOR_CODES.get(descriptor)
    return descriptor


def decode_composite(value: Any, expected: tuple[type, ...] | None = None) -> Any:
    """Turn a decoded ``Described`` into its composite class (if known and, when given, one of ``expected``).

    Unknown descriptors are returned unchanged (as ``Described``), which keeps extension types intact.
    """
    if not isinstance(value, Described):
        if expected is not None:
            raise InvalidField(f"expected one of {[c.__name__ for c in expected]}, got {type(value).__name__}")
        return value
    cls = COMPOSITES.get(_code_of(value.descriptor))  # type: ignore[arg-type]
    if cls is None or (expected is not None and not issubclass(cls, expected)):
        if expected is not None:
            raise InvalidField(f"unexpected descriptor {value.descriptor!r}")
        return value
    if not isinstance(value.value, list):
        raise InvalidField(f"{cls.NAME} body must be a list")
    return cls.from_fields(value.value)


# ------------------------------------------------------------------------------------------------ error


@dataclass(slots=True)
class Error(Composite):
    """``amqp:error:list``: condition symbol, description, info map."""

    condition: str = ""
    description: str | None = None
    info: dict[Any, Any] | None = None


_define(Error, 0x1D, "amqp:error:list", [SYMBOL, STRING, FIELDS], mandatory=(0,))
# Always write all three fields: the Azure SDK reads condition, description and info by index.
Error._MIN_LEN = 3

ERROR = _Kind(e_any, None, lambda v: decode_composite(v, (Error,)))

# --------------------------------------------------------------------------------------- delivery states


class DeliveryState(Composite):
    """Base of delivery states (received, the outcomes, declared, transactional-state)."""

    __slots__ = ()


class Outcome(DeliveryState):
    """Base of terminal outcomes (accepted, rejected, released, modified, declared)."""

    __slots__ = ()


@dataclass(slots=True)
class Received(DeliveryState):
    """``amqp:received:list``: resume point of a partially received delivery."""

    section_number: int = 0
    section_offset: int = 0


@dataclass(slots=True)
class Accepted(Outcome):
    """``amqp:accepted:list``."""


@dataclass(slots=True)
class Rejected(Outcome):
    """``amqp:rejected:list`` with an optional error."""

    error: Error | None = None


@dataclass(slots=True)
class Released(Outcome):
    """``amqp:released:list``."""


@dataclass(slots=True)
class Modified(Outcome):
    """``amqp:modified:list``: abandon (delivery_failed) / defer (undeliverable_here) in Service Bus terms."""

    delivery_failed: bool | None = None
    undeliverable_here: bool | None = None
    message_annotations: dict[Any, Any] | None = None


@dataclass(slots=True)
class Declared(Outcome):
    """``amqp:declared:list``: the coordinator's answer to ``declare``."""

    txn_id: bytes = b""


@dataclass(slots=True)
class TransactionalState(DeliveryState):
    """``amqp:transactional-state:list``."""

    txn_id: bytes = b""
    outcome: Any = None


STATE = _Kind(e_any, None, lambda v: decode_composite(v, (DeliveryState,)))

_define(Received, 0x23, "amqp:received:list", [UINT, ULONG], mandatory=(0, 1))
_define(Accepted, 0x24, "amqp:accepted:list", [])
_define(Rejected, 0x25, "amqp:rejected:list", [ERROR])
_define(Released, 0x26, "amqp:released:list", [])
_define(Modified, 0x27, "amqp:modified:list", [BOOL, BOOL, FIELDS])
_define(Declared, 0x33, "amqp:declared:list", [BINARY], mandatory=(0,))
_define(TransactionalState, 0x34, "amqp:transactional-state:list", [BINARY, STATE], mandatory=(0,))

# -------------------------------------------------------------------------------------------- terminus


@dataclass(slots=True)
class Source(Composite):
    """``amqp:source:list``. ``filter`` is the filter-set (symbol keys; values often ``Described``)."""

    address: Any = None
    durable: int = 0
    expiry_policy: str = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: str | None = None
    filter: dict[Any, Any] | None = None
    default_outcome: Any = None
    outcomes: list[Symbol] | None = None
    capabilities: list[Symbol] | None = None


@dataclass(slots=True)
class Target(Composite):
    """``amqp:target:list``."""

    address: Any = None
    durable: int = 0
    expiry_policy: str = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    capabilities: list[Symbol] | None = None


@dataclass(slots=True)
class Coordinator(Composite):
    """``amqp:coordinator:list``: the target of a transaction controller link."""

    capabilities: list[Symbol] | None = None


@dataclass(slots=True)
class Declare(Composite):
    """``amqp:declare:list``: body (amqp-value) of a message asking the coordinator for a transaction."""

    global_id: Any = None


@dataclass(slots=True)
class Discharge(Composite):
    """``amqp:discharge:list``: commit (fail=False) or roll back a transaction."""

    txn_id: bytes = b""
    fail: bool | None = None


_define(
    Source,
    0x28,
    "amqp:source:list",
    [ANY, UINT, SYMBOL, UINT, BOOL, FIELDS, SYMBOL, FIELDS, STATE, SYMBOLS, SYMBOLS],
)
_define(Target, 0x29, "amqp:target:list", [ANY, UINT, SYMBOL, UINT, BOOL, FIELDS, SYMBOLS])
_define(Coordinator, 0x30, "amqp:coordinator:list", [SYMBOLS])
_define(Declare, 0x31, "amqp:declare:list", [ANY])
_define(Discharge, 0x32, "amqp:discharge:list", [BINARY, BOOL], mandatory=(0,))

UNSETTLED = _Kind(codec.e_map, (dict,), lambda v: {k: decode_composite(x) for k, x in v.items()})
SOURCE = _Kind(e_any, None, lambda v: decode_composite(v, (Source,)))
TARGET = _Kind(e_any, None, lambda v: decode_composite(v, (Target, Coordinator)))

# ------------------------------------------------------------------------------------------ performatives


class Performative(Composite):
    """Base of the frame bodies (AMQP and SASL)."""

    __slots__ = ()


@dataclass(slots=True)
class Open(Performative):
    """``open`` (0x10)."""

    container_id: str = ""
    hostname: str | None = None
    max_frame_size: int = 0xFFFFFFFF
    channel_max: int = 0xFFFF
    idle_time_out: int | None = None
    outgoing_locales: list[Symbol] | None = None
    incoming_locales: list[Symbol] | None = None
    offered_capabilities: list[Symbol] | None = None
    desired_capabilities: list[Symbol] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)
class Begin(Performative):
    """``begin`` (0x11)."""

    remote_channel: int | None = None
    next_outgoing_id: int = 0
    incoming_window: int = 0
    outgoing_window: int = 0
    handle_max: int = 0xFFFFFFFF
    offered_capabilities: list[Symbol] | None = None
    desired_capabilities: list[Symbol] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)
class Attach(Performative):
    """``attach`` (0x12). ``role``: False = sender, True = receiver."""

    name: str = ""
    handle: int = 0
    role: bool = False
    snd_settle_mode: int = SndSettleMode.MIXED
    rcv_settle_mode: int = RcvSettleMode.FIRST
    source: Any = None
    target: Any = None
    unsettled: dict[Any, Any] | None = None
    incomplete_unsettled: bool = False
    initial_delivery_count: int | None = None
    max_message_size: int | None = None
    offered_capabilities: list[Symbol] | None = None
    desired_capabilities: list[Symbol] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)
class Flow(Performative):
    """``flow`` (0x13): session window update plus, with ``handle``, link credit state."""

    next_incoming_id: int | None = None
    incoming_window: int = 0
    next_outgoing_id: int = 0
    outgoing_window: int = 0
    handle: int | None = None
    delivery_count: int | None = None
    link_credit: int | None = None
    available: int | None = None
    drain: bool = False
    echo: bool = False
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)
class Transfer(Performative):
    """``transfer`` (0x14). The payload follows the performative in the frame and is not a field."""

    handle: int = 0
    delivery_id: int | None = None
    delivery_tag: bytes | None = None
    message_format: int | None = None
    settled: bool | None = None
    more: bool = False
    rcv_settle_mode: int | None = None
    state: Any = None
    resume: bool = False
    aborted: bool = False
    batchable: bool = False


@dataclass(slots=True)
class Disposition(Performative):
    """``disposition`` (0x15): ``role`` is the role of the sender of this frame."""

    role: bool = False
    first: int = 0
    last: int | None = None
    settled: bool = False
    state: Any = None
    batchable: bool = False


@dataclass(slots=True)
class Detach(Performative):
    """``detach`` (0x16)."""

    handle: int = 0
    closed: bool = False
    error: Error | None = None


@dataclass(slots=True)
class End(Performative):
    """``end`` (0x17)."""

    error: Error | None = None


@dataclass(slots=True)
class Close(Performative):
    """``close`` (0x18)."""

    error: Error | None = None


@dataclass(slots=True)
class SaslMechanisms(Performative):
    """``sasl-mechanisms`` (0x40)."""

    sasl_server_mechanisms: list[Symbol] | None = None


@dataclass(slots=True)
class SaslInit(Performative):
    """``sasl-init`` (0x41)."""

    mechanism: str = ""
    initial_response: bytes | None = None
    hostname: str | None = None


@dataclass(slots=True)
class SaslChallenge(Performative):
    """``sasl-challenge`` (0x42)."""

    challenge: bytes = b""


@dataclass(slots=True)
class SaslResponse(Performative):
    """``sasl-response`` (0x43)."""

    response: bytes = b""


@dataclass(slots=True)
class SaslOutcome(Performative):
    """``sasl-outcome`` (0x44)."""

    code: int = SaslCode.OK
    additional_data: bytes | None = None


_S = SYMBOLS
_define(Open, 0x10, "amqp:open:list", [STRING, STRING, UINT, USHORT, UINT, _S, _S, _S, _S, FIELDS], (0,))
_define(Begin, 0x11, "amqp:begin:list", [USHORT, UINT, UINT, UINT, UINT, _S, _S, FIELDS], (1, 2, 3))
_define(
    Attach,
    0x12,
    "amqp:attach:list",
    [STRING, UINT, BOOL, UBYTE, UBYTE, SOURCE, TARGET, UNSETTLED, BOOL, UINT, ULONG, _S, _S, FIELDS],
    (0, 1, 2),
)
_define(
    Flow,
    0x13,
    "amqp:flow:list",
    [UINT, UINT, UINT, UINT, UINT, UINT, UINT, UINT, BOOL, BOOL, FIELDS],
    (1, 2, 3),
)
_define(
    Transfer,
    0x14,
    "amqp:transfer:list",
    [UINT, UINT, BINARY, UINT, BOOL, BOOL, UBYTE, STATE, BOOL, BOOL, BOOL],
    (0,),
)
_define(Disposition, 0x15, "amqp:disposition:list", [BOOL, UINT, UINT, BOOL, STATE, BOOL], (0, 1))
_define(Detach, 0x16, "amqp:detach:list", [UINT, BOOL, ERROR], (0,))
_define(End, 0x17, "amqp:end:list", [ERROR])
_define(Close, 0x18, "amqp:close:list", [ERROR])
_define(SaslMechanisms, 0x40, "amqp:sasl-mechanisms:list", [SYMBOLS], (0,))
_define(SaslInit, 0x41, "amqp:sasl-init:list", [SYMBOL, BINARY, STRING], (0,))
_define(SaslChallenge, 0x42, "amqp:sasl-challenge:list", [BINARY], (0,))
_define(SaslResponse, 0x43, "amqp:sasl-response:list", [BINARY], (0,))
_define(SaslOutcome, 0x44, "amqp:sasl-outcome:list", [UBYTE, BINARY], (0,))

_PERFORMATIVE_CODES = frozenset(range(0x10, 0x19)) | frozenset(range(0x40, 0x45))
_LIST_CTORS = frozenset((0x45, 0xC0, 0xD0))


def encode_performative(perf: Composite) -> bytes:
    """The frame body for ``perf`` (without payload)."""
    out = bytearray()
    perf.encode_into(out)
    return bytes(out)


# ------------------------------------------------------------------------------------- fast decoders
#
# Every delivery costs the broker at least one transfer, usually a disposition, and now and then a flow. For
# these three the generic path (``_list_items`` building a list, then ``from_fields`` checking it) is replaced by
# a decoder generated per class that reads the fields straight into the constructor. It accepts only the common
# encodings of each field (see ``_FAST_FIELD``) and returns None for anything else, including anything malformed,
# so that the generic decoder decides (and raises its own error): the fast path never accepts what the generic
# path rejects, and gives the same values of the same types for what it accepts.

_FAST_UINT = """    if c == 0x52:
        f{i} = _UINTS[b[p + 1]]
        p += 2
    elif c == 0x43:
        f{i} = _UINT0
        p += 1
    elif c == 0x70:
        f{i} = _int_new(_UInt, _I(b, p + 1)[0])
        p += 5
"""
_FAST_BOOL = """    if c == 0x41:
        f{i} = True
        p += 1
    elif c == 0x42:
        f{i} = False
        p += 1
    elif c == 0x56:
        x = b[p + 1]
        if x > 1:
            return None
        f{i} = x == 1
        p += 2
"""
_FAST_BINARY = """    if c == 0xA0:
        s = p + 2
        p = s + b[p + 1]
        f{i} = b[s:p]
    elif c == 0xB0:
        s = p + 5
        p = s + _I(b, p + 1)[0]
        f{i} = b[s:p]
"""
_FAST_UBYTE = """    if c == 0x50:
        f{i} = _UBYTES[b[p + 1]]
        p += 2
"""
# Delivery states without fields (accepted, released), as list0 or as an empty list8; a truncated buffer raises
# IndexError, which sends the frame to the generic decoder.
_FAST_STATE = """    if c == 0 and b[p + 1] == 0x53 and b[p + 2] in _EMPTY_STATES:
        if b[p + 3] == 0x45:
            f{i} = _EMPTY_STATES[b[p + 2]]()
            p += 4
        elif b[p + 3] == 0xC0 and b[p + 4] == 1 and b[p + 5] == 0:
            f{i} = _EMPTY_STATES[b[p + 2]]()
            p += 6
        else:
            return None
"""
_FAST_FIELD: dict[str, str] = {"UINT": _FAST_UINT, "BOOL": _FAST_BOOL, "BINARY": _FAST_BINARY, "UBYTE": _FAST_UBYTE}


def _make_fast_decoder(cls: Any, kinds: Sequence[str]) -> Callable[[bytes], tuple[Any, int] | None]:
    """Generate ``fast(body) -> (composite, payload offset) | None`` for a frame body that starts with
    ``00 53 <cls.CODE>``. ``kinds`` names each field's accepted encodings: a key of ``_FAST_FIELD``, ``STATE`` or
    ``NULL`` (only null accepted). Null takes the field's default; a null or absent mandatory field, an unknown
    constructor, a list that is not list8/list32, more fields than the class has, or a size that does not match
    the fields all return None."""
    n = cls._NFIELDS
    min_count = cls._MIN_LEN if cls._MANDATORY else 0
    env: dict[str, Any] = {
        "cls": cls,
        "_UINTS": codec._UINTS,
        "_UINT0": codec._UINTS[0],
        "_UBYTES": codec._UBYTES,
        "_I": codec._I,
        "_II": codec._II,
        "_int_new": int.__new__,
        "_UInt": UInt,
        "_EMPTY_STATES": {Accepted.CODE: Accepted, Released.CODE: Released},
    }
    lines = [
        "def fast(b):",
        "    c = b[3]",
        "    if c == 0xC0:",
        "        size = b[4]",
        "        count = b[5]",
        "        p = 6",
        "        end = 5 + size",
        "        if size == 0:",
        "            return None",
        "    elif c == 0xD0:",
        "        size, count = _II(b, 4)",
        "        p = 12",
        "        end = 8 + size",
        "        if size < 4:",
        "            return None",
        "    else:",
        "        return None",
        f"    if end > len(b) or count < {min_count} or count > {n}:",
        "        return None",
    ]
    defaults = []  # each field's default, as the source text that produces it
    for i, d in enumerate(cls._DEFAULTS):
        if d is None or d.__class__ in (bool, int):
            defaults.append(repr(d))  # a constant: cheaper than a global
        else:
            env[f"d{i}"] = d
            defaults.append(f"d{i}")
    lines += [f"    f{i} = {defaults[i]}" for i in range(len(kinds), n)]  # fields this decoder never reads
    # Built from the last field back: an optional field's check encloses every later field, so the first absent
    # one skips the rest at once (our client's transfers set 5 of their 11 fields), and only absent or null
    # fields are given their defaults.
    rest = ""
    for i in reversed(range(len(kinds))):
        body = _FAST_STATE if kinds[i] == "STATE" else _FAST_FIELD.get(kinds[i], "")
        mandatory = i in cls._MANDATORY
        null = "        return None\n" if mandatory else f"        f{i} = {defaults[i]}\n        p += 1\n"
        block = "    c = b[p]\n" + body.format(i=i)
        block += ("    elif" if body else "    if") + " c == 0x40:\n" + null + "    else:\n        return None\n"
        rest = block + rest
        if not mandatory:  # mandatory fields are within min_count, always present
            absent = "".join(f"        f{k} = {defaults[k]}\n" for k in range(i, len(kinds)))
            nested = "".join("    " + x + "\n" for x in rest.splitlines())
            rest = f"    if count > {i}:\n" + nested + "    else:\n" + absent
    lines.append(rest.rstrip("\n"))
    # The performative made with ``object.__new__`` and its fields stored one by one: what its dataclass __init__
    # does, without that Python call (every transfer, flow and disposition comes here; none has __post_init__).
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(names) == n and not hasattr(cls, "__post_init__")
    lines += ["    if p != end:", "        return None", "    o = _object_new(cls)"]
    lines += [f"    o.{name} = f{i}" for i, name in enumerate(names)]
    lines.append("    return o, end")
    env["_object_new"] = object.__new__
    exec("\n".join(lines), env)
    return env["fast"]  # type: ignore[no-any-return]


_FAST_DECODERS: dict[int, Callable[[bytes], tuple[Any, int] | None]] = {
    Transfer.CODE: _make_fast_decoder(
        Transfer,
        ["UINT", "UINT", "BINARY", "UINT", "BOOL", "BOOL", "UBYTE", "STATE", "BOOL", "BOOL", "BOOL"],
    ),
    Disposition.CODE: _make_fast_decoder(Disposition, ["BOOL", "UINT", "UINT", "BOOL", "STATE", "BOOL"]),
    Flow.CODE: _make_fast_decoder(
        Flow, ["UINT", "UINT", "UINT", "UINT", "UINT", "UINT", "UINT", "UINT", "BOOL", "BOOL", "NULL"]
    ),
}


# Dispositions by what follows their ``first`` field. A client settles its deliveries one by one with the same
# last (null), settled, state (accepted, say) and batchable, so the bytes after ``first`` repeat: once the
# generated decoder has read such a tail, it is looked up instead of read again. Only tails with a null last and a
# fieldless state (or none) are kept, and the values are those the generated decoder gave for the same bytes.
_DISPOSITION_TAILS: dict[tuple[int, bytes], tuple[Any, Any, Any]] = {}  # (count, tail) -> settled, state, batchable
_decode_disposition = _FAST_DECODERS[Disposition.CODE]
_int_new = int.__new__
_uint_at = codec._I
_object_new = object.__new__


def _fast_disposition(b: bytes) -> tuple[Any, int] | None:
    """``_FAST_DECODERS[Disposition.CODE]`` with the tail lookup above (list8 only; anything else as before)."""
    if b[3] == 0xC0:
        end = 5 + b[4]
        c = b[6]
        if c == 0x41 or c == 0x42:  # role: true or false (our client), or as a boolean byte (the SDK's)
            role, q = c == 0x41, 7
        elif c == 0x56 and b[7] <= 1:
            role, q = b[7] == 1, 8
        else:
            q = 0
        if q:
            c = b[q]
            if c == 0x52:
                first, p = _UINTS[b[q + 1]], q + 2
            elif c == 0x70:
                first, p = _int_new(UInt, _uint_at(b, q + 1)[0]), q + 5  # no slice: every delivery id above 255
            else:
                first, p = None, 0
            if first is not None and p <= end <= len(b):
                known = _DISPOSITION_TAILS.get((b[5], b[p:end]))
                if known is not None:  # the performative as the generated decoder makes it: no __init__ call
                    d = _object_new(Disposition)
                    d.role = role
                    d.first = first
                    d.last = None
                    d.settled, state, d.batchable = known
                    # Accepted and Released have no fields: an instance needs no __init__ either
                    d.state = None if state is None else _object_new(state)
                    return d, end
                done = _decode_disposition(b)
                if done is not None:
                    d = done[0]
                    if d.last is None and (d.state is None or d.state.__class__ in (Accepted, Released)):
                        if len(_DISPOSITION_TAILS) >= 64:
                            _DISPOSITION_TAILS.clear()
                        state_class = None if d.state is None else d.state.__class__
                        _DISPOSITION_TAILS[b[5], b[p:end]] = (d.settled, state_class, d.batchable)
                return done
    return _decode_disposition(b)


_FAST_DECODERS[Disposition.CODE] = _fast_disposition
_UINTS = codec._UINTS
_UINT0 = codec._UINTS[0]

# Transfers by what follows their delivery tag. A sender's single-frame transfers differ only in delivery id and
# tag; the fields after the tag (message format, settled, more, ..., our client's "43 42", the SDK's six) repeat,
# so once the generated decoder has read such a tail it is looked up instead of read again, as dispositions' are.
# Only stateless tails are kept (a state is an object per transfer); bounded as ``_DISPOSITION_TAILS``.
_TRANSFER_TAILS: dict[tuple[int, bytes], tuple[Any, ...]] = {}  # (count, tail) -> fields 3 to 10
PLAIN_TRANSFER_TAILS: dict[tuple[int, bytes], tuple[Any, bool, Any]] = {}
"""The tails of ``_TRANSFER_TAILS`` whose transfer is plain (no more, aborted, resume, state or rcv-settle-mode):
(count, tail) -> (message format or 0, settled, batchable), as ``Link.on_transfer`` reads them. Filled and
cleared with ``_TRANSFER_TAILS``; ``transfer_run`` takes only transfers whose tail is here."""
_decode_transfer = _FAST_DECODERS[Transfer.CODE]


def _fast_transfer(b: bytes) -> tuple[Any, int] | None:
    """``_FAST_DECODERS[Transfer.CODE]`` with the tail lookup above (list8, a handle, a delivery id and a vbin8
    tag; anything else as before)."""
    if b[3] == 0xC0 and b[5] >= 3:
        end = 5 + b[4]
        c = b[6]
        if c == 0x43:
            handle, p = _UINT0, 7
        elif c == 0x52:
            handle, p = _UINTS[b[7]], 8
        else:
            p = 0
        if p:
            c = b[p]
            if c == 0x52:
                did, p = _UINTS[b[p + 1]], p + 2
            elif c == 0x70:
                did, p = _int_new(UInt, _uint_at(b, p + 1)[0]), p + 5
            elif c == 0x43:
                did, p = _UINT0, p + 1
            else:
                p = 0
            if p and b[p] == 0xA0:
                s = p + 2
                p = s + b[p + 1]
                if p <= end <= len(b):
                    known = _TRANSFER_TAILS.get((b[5], b[p:end]))
                    if known is not None:  # the performative as the generated decoder makes it
                        t = _object_new(Transfer)
                        t.handle = handle
                        t.delivery_id = did
                        t.delivery_tag = b[s:p]
                        (
                            t.message_format,
                            t.settled,
                            t.more,
                            t.rcv_settle_mode,
                            t.state,
                            t.resume,
                            t.aborted,
                            t.batchable,
                        ) = known
                        return t, end
                    done = _decode_transfer(b)
                    if done is not None and done[0].state is None:
                        if len(_TRANSFER_TAILS) >= 64:
                            _TRANSFER_TAILS.clear()
                            PLAIN_TRANSFER_TAILS.clear()
                        t = done[0]
                        if not (t.more or t.aborted or t.resume) and t.rcv_settle_mode is None:
                            fields = (t.message_format or 0, t.settled is True, t.batchable)
                            PLAIN_TRANSFER_TAILS[b[5], b[p:end]] = fields
                        _TRANSFER_TAILS[b[5], b[p:end]] = (
                            t.message_format,
                            t.settled,
                            t.more,
                            t.rcv_settle_mode,
                            None,
                            t.resume,
                            t.aborted,
                            t.batchable,
                        )
                    return done
    return _decode_transfer(b)


_FAST_DECODERS[Transfer.CODE] = _fast_transfer


def decode_performative_generic(body: bytes) -> tuple[Any, int]:
    """``decode_performative`` without the fast decoders (the reference the fast ones are tested against)."""
    return decode_performative(body, False)


def decode_performative(body: bytes, fast: bool = True) -> tuple[Any, int]:
    """Decode the performative at the start of a frame body; return it and the offset of the payload.

    Raises ``DecodeError`` (``InvalidField`` for a bad field) and nothing else.
    """
    try:
        if body[0] != 0:
            raise DecodeError("frame body is not a described type")
        if body[1] == 0x53:
            code = body[2]
            if fast:
                dec = _FAST_DECODERS.get(code)
                if dec is not None:
                    try:
                        done = dec(body)
                    except codec.LOW_LEVEL_ERRORS:
                        done = None  # malformed: the generic decoder below reports it
                    if done is not None:
                        return done
            p = 3
        else:
            desc, p = codec._decode_descriptor(body, 1, 0)
            code = _code_of(desc)
        if code not in _PERFORMATIVE_CODES:
            raise DecodeError(f"unknown performative {code!r}")
        c = body[p]
        if c not in _LIST_CTORS:
            raise DecodeError("performative body is not a list")
        fields, end = codec._DEC[c](body, p + 1, 1)
        return COMPOSITES[code].from_fields(fields), end
    except DecodeError:
        raise
    except codec.LOW_LEVEL_ERRORS as exc:
        raise DecodeError(f"malformed performative: {exc!r}") from None
