"""The Service Bus SQL subset used by subscription rules: lexer, parser and closure compiler.

A filter or action expression is parsed once, when the rule is built, into a tree of small Python closures;
evaluating a filter against a message then costs a handful of function calls rather than a walk over text.
Grammar and semantics follow Microsoft's "Subscription Rule SQL Filter Syntax" and "Subscription Rule SQL
Action Syntax" pages:

* ``[sys.|user.]name``, ``[delimited name]`` and ``"quoted name"`` property references; property names are
  case-insensitive; an unknown ``sys.`` property is rejected when the rule is built.
* A missing user property (or a NULL) evaluates to *unknown*; arithmetic, comparison and LIKE on unknown are
  unknown; AND/OR/NOT use SQL three-valued logic; only a *true* filter result selects a message.
* Operators follow C# binding: ``long`` arithmetic wraps at 64 bits and ``/`` truncates toward zero, a
  ``long``/``double`` mix is computed as ``double``, strings compare ordinally (case-sensitively), and
  comparing values of unrelated types is unknown rather than false.
* An evaluation error (integer division by zero, a bad ESCAPE, an unknown system property named through
  ``property()``) makes the whole filter not match, as the service's FilterException does.

Syntax errors raise :class:`ArgumentError` naming the 1-based position and the offending token.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import ArgumentError
from .message import Message

MAX_EXPRESSION_LENGTH = 1024  # the service's limit for filter and action expressions
MAX_ACTION_STATEMENTS = 32  # "Maximum number of expressions per rule action"

Evaluator = Callable[[Message], Any]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_MISSING = object()

# ---------------------------------------------------------------------------------------------------------
# System properties
# ---------------------------------------------------------------------------------------------------------


def _enqueued_time(m: Message) -> datetime | None:
    return m.enqueued_time


def _expires_at(m: Message) -> datetime | None:
    return m.expires_at


def _size(m: Message) -> int:
    return len(m.body)


_attr = operator.attrgetter
# Readable system properties, keyed by lower-cased name (names are case-insensitive).
SYSTEM_GETTERS: dict[str, Callable[[Message], Any]] = {
    "messageid": _attr("message_id"),
    "correlationid": _attr("correlation_id"),
    "sessionid": _attr("session_id"),
    "replytosessionid": _attr("reply_to_session_id"),
    "label": _attr("subject"),
    "subject": _attr("subject"),
    "to": _attr("to"),
    "replyto": _attr("reply_to"),
    "contenttype": _attr("content_type"),
    "partitionkey": _attr("partition_key"),
    "timetolive": _attr("time_to_live"),
    "scheduledenqueuetimeutc": _attr("scheduled_enqueue_time"),
    "enqueuedtimeutc": _enqueued_time,
    "expiresatutc": _expires_at,
    "sequencenumber": _attr("sequence_number"),
    "enqueuedsequencenumber": _attr("enqueued_sequence_number"),
    "deliverycount": _attr("delivery_count"),
    "deadlettersource": _attr("dead_letter_source"),
    "size": _size,
}

# System properties an action may SET or REMOVE: lower-cased name -> (Message attribute, value kind).
SETTABLE_SYSTEM: dict[str, tuple[str, str]] = {
    "messageid": ("message_id", "str"),
    "correlationid": ("correlation_id", "str"),
    "sessionid": ("session_id", "str"),
    "replytosessionid": ("reply_to_session_id", "str"),
    "label": ("subject", "str"),
    "subject": ("subject", "str"),
    "to": ("to", "str"),
    "replyto": ("reply_to", "str"),
    "contenttype": ("content_type", "str"),
    "partitionkey": ("partition_key", "str"),
    "timetolive": ("time_to_live", "timedelta"),
    "scheduledenqueuetimeutc": ("scheduled_enqueue_time", "datetime"),
}


class EvaluationError(Exception):
    """Raised by an evaluator where the service throws a FilterException; the filter then does not match."""


def find_user_key(props: Mapping[str, Any], name: str) -> Any:
    """The key under which ``name`` is stored, matched case-insensitively, or ``_MISSING``."""
    if name in props:
        return name
    lname = name.lower()
    for key in props:
        if isinstance(key, str) and key.lower() == lname:
            return key
    return _MISSING


def _user_getter(name: str) -> Evaluator:
    lname = name.lower()

    def get(m: Message) -> Any:
        props = m.application_properties
        if not props:
            return None
        value = props.get(name, _MISSING)
        if value is _MISSING:
            for key, value in props.items():
                if isinstance(key, str) and key.lower() == lname:
                    return value
            return None
        return value

    return get


def _user_exists(name: str) -> Evaluator:
    def exists(m: Message) -> bool:
        props = m.application_properties
        return bool(props) and find_user_key(props, name) is not _MISSING

    return exists


def _resolve_dynamic(m: Message, ref: Any) -> Any:
    """``property(name)`` with a computed name: resolve the reference against this message."""
    if not isinstance(ref, str):
        return None
    scope, _, rest = ref.partition(".")
    lscope = scope.lower()
    if rest and lscope == "sys":
        getter = SYSTEM_GETTERS.get(rest.lower())
        if getter is None:
            raise EvaluationError(f"unknown system property {ref!r}")
        return getter(m)
    if rest and lscope == "user":
        ref = rest
    props = m.application_properties
    if not props:
        return None
    key = find_user_key(props, ref)
    return None if key is _MISSING else props[key]


# ---------------------------------------------------------------------------------------------------------
# Value semantics
# ---------------------------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _utc(v: datetime) -> datetime:
    return v.replace(tzinfo=UTC) if v.tzinfo is None else v


_EQUALITY_OPS = (operator.eq, operator.ne)


def compare(op: Callable[[Any, Any], bool], a: Any, b: Any) -> bool | None:
    """SQL comparison with C#-like binding: unknown (None) when either side is NULL or the types don't mix."""
    if a is None or b is None:
        return None
    if _is_number(a) and _is_number(b):
        return op(a, b)
    if isinstance(a, str) and isinstance(b, str):
        return op(str(a), str(b))  # ordinal, case-sensitive (C# string semantics)
    if isinstance(a, bool) and isinstance(b, bool):
        return op(a, b) if op in _EQUALITY_OPS else None
    if isinstance(a, datetime) and isinstance(b, datetime):
        return op(_utc(a), _utc(b))
    if isinstance(a, timedelta) and isinstance(b, timedelta):
        return op(a, b)
    if type(a) is type(b) and op in _EQUALITY_OPS:
        try:
            return bool(op(a, b))
        except Exception:
            return None
    return None


def values_equal(a: Any, b: Any) -> bool:
    """True only when ``a = b`` is true in SQL terms (used by IN and correlation filters)."""
    if type(a) is str and type(b) is str:
        return a == b
    return compare(operator.eq, a, b) is True


def _wrap64(v: int) -> int:
    if _INT64_MIN <= v <= _INT64_MAX:
        return v
    return ((v - _INT64_MIN) % 2**64) + _INT64_MIN


def _int_div(a: int, b: int) -> int:
    if b == 0:
        raise EvaluationError("integer division by zero")
    q = abs(a) // abs(b)
    return _wrap64(-q if (a < 0) != (b < 0) else q)


def _int_mod(a: int, b: int) -> int:
    if b == 0:
        raise EvaluationError("integer division by zero")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _float_div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _float_mod(a: float, b: float) -> float:
    if b == 0:
        return math.nan
    return math.fmod(a, b)


_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: _wrap64(a + b),
    "-": lambda a, b: _wrap64(a - b),
    "*": lambda a, b: _wrap64(a * b),
    "/": _int_div,
    "%": _int_mod,
}
_FLOAT_OPS: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _float_div,
    "%": _float_mod,
}


def _cs_string(v: Any) -> str:
    """C#'s ToString for the scalar types a property can hold (used by string concatenation)."""
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


def arithmetic(op: str, a: Any, b: Any) -> Any:
    """Binary arithmetic with C# promotions; unknown (None) on NULL operands or types that don't combine."""
    if a is None or b is None:
        return None
    if type(a) is int and type(b) is int:
        return _INT_OPS[op](a, b)
    if _is_number(a) and _is_number(b):
        if isinstance(a, int) and isinstance(b, int):
            return _INT_OPS[op](int(a), int(b))
        return _FLOAT_OPS[op](float(a), float(b))
    if op == "+" and (isinstance(a, str) or isinstance(b, str)):
        if isinstance(a, str | int | float) and isinstance(b, str | int | float):
            return _cs_string(a) + _cs_string(b)
        return None
    if isinstance(a, datetime) and isinstance(b, timedelta) and op in "+-":
        return _utc(a) + b if op == "+" else _utc(a) - b
    if isinstance(a, timedelta) and isinstance(b, datetime) and op == "+":
        return _utc(b) + a
    if isinstance(a, datetime) and isinstance(b, datetime) and op == "-":
        return _utc(a) - _utc(b)
    if isinstance(a, timedelta) and isinstance(b, timedelta) and op in "+-":
        return a + b if op == "+" else a - b
    return None


def negate(v: Any) -> Any:
    if v is None:
        return None
    if type(v) is int or (isinstance(v, int) and not isinstance(v, bool)):
        return _wrap64(-int(v))
    if isinstance(v, float | timedelta):
        return -v
    return None


def _plus(v: Any) -> Any:
    return v if _is_number(v) or isinstance(v, timedelta) else None


@functools.lru_cache(maxsize=512)
def like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    """Translate a LIKE pattern (``%``, ``_``, optional escape character) into an anchored regex."""
    parts: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < n:
            i += 1
            parts.append(re.escape(pattern[i]))
        elif c == "%":
            parts.append(".*")
        elif c == "_":
            parts.append(".")
        else:
            parts.append(re.escape(c))
        i += 1
    return re.compile("".join(parts), re.DOTALL)


# ---------------------------------------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------------------------------------

KEYWORDS = frozenset({"and", "or", "not", "is", "null", "in", "like", "escape", "exists", "true", "false"})
_TWO_CHAR_OPS = ("<=", ">=", "<>", "!=")
_ONE_CHAR_OPS = "=<>+-*/%(),.;"


class Token:
    __slots__ = ("kind", "pos", "text", "value")

    def __init__(self, kind: str, value: Any, pos: int, text: str) -> None:
        self.kind = kind  # int, float, str, ident, qident, param, kw, op, eof
        self.value = value
        self.pos = pos
        self.text = text

    def describe(self) -> str:
        return "end of expression" if self.kind == "eof" else repr(self.text)


def _syntax_error(what: str, source: str, pos: int, message: str, near: str | None = None) -> ArgumentError:
    """Errors name the 1-based position and, where there is one, the token found there."""
    where = f"at position {pos + 1}" + (f" near {near}" if near else "")
    return ArgumentError(f"Invalid {what} {source!r}: {message} {where}")


def tokenize(source: str, what: str = "SQL expression") -> list[Token]:
    """Split ``source`` into tokens; raises ArgumentError on characters or literals the language lacks."""
    tokens: list[Token] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c.isspace():
            i += 1
            continue
        start = i
        if c == "'":
            value, i = _read_quoted(source, i, "'", what, "unterminated string literal")
            tokens.append(Token("str", value, start, source[start:i]))
        elif c == "[":
            value, i = _read_quoted(source, i, "]", what, "unterminated delimited identifier")
            if not value:
                raise _syntax_error(what, source, start, "empty delimited identifier '[]'")
            tokens.append(Token("qident", value, start, source[start:i]))
        elif c == '"':
            value, i = _read_quoted(source, i, '"', what, "unterminated quoted identifier")
            if not value:
                raise _syntax_error(what, source, start, "empty quoted identifier '\"\"'")
            tokens.append(Token("qident", value, start, source[start:i]))
        elif c.isdecimal() or (c == "." and i + 1 < n and source[i + 1].isdecimal()):
            tokens.append(_read_number(source, i, what))
            i += len(tokens[-1].text)
        elif c.isalpha():
            i += 1
            while i < n and (source[i].isalnum() or source[i] == "_"):
                i += 1
            text = source[start:i]
            kind = "kw" if text.lower() in KEYWORDS else "ident"
            tokens.append(Token(kind, text.lower() if kind == "kw" else text, start, text))
        elif c == "@":
            i += 1
            while i < n and (source[i].isalnum() or source[i] == "_"):
                i += 1
            if i == start + 1:
                raise _syntax_error(what, source, start, "'@' must be followed by a parameter name")
            tokens.append(Token("param", source[start + 1 : i], start, source[start:i]))
        elif source.startswith(_TWO_CHAR_OPS, i):
            op = source[i : i + 2]
            tokens.append(Token("op", "<>" if op == "!=" else op, start, op))
            i += 2
        elif c in _ONE_CHAR_OPS:
            tokens.append(Token("op", c, start, c))
            i += 1
        else:
            raise _syntax_error(what, source, start, f"unexpected character {c!r}")
    tokens.append(Token("eof", None, n, ""))
    return tokens


def _read_quoted(source: str, i: int, close: str, what: str, error: str) -> tuple[str, int]:
    """Read from the opening quote at ``i``; a doubled closing character stands for itself."""
    start = i
    i += 1
    chunks: list[str] = []
    n = len(source)
    while True:
        j = source.find(close, i)
        if j < 0:
            raise _syntax_error(what, source, start, error)
        chunks.append(source[i:j])
        if j + 1 < n and source[j + 1] == close:
            chunks.append(close)
            i = j + 2
            continue
        return "".join(chunks), j + 1


_NUMBER = re.compile(r"(\d*)(\.\d*)?([eE][+-]?\d+)?")


def _read_number(source: str, i: int, what: str) -> Token:
    match = _NUMBER.match(source, i)
    assert match is not None
    end = match.end()
    text = source[i:end]
    if end < len(source) and (source[end].isalnum() or source[end] in "_."):
        bad = end
        while bad < len(source) and (source[bad].isalnum() or source[bad] in "_."):
            bad += 1
        raise _syntax_error(what, source, i, f"invalid number {source[i:bad]!r}")
    if match.group(2) is None and match.group(3) is None:
        return Token("int", int(text), i, text)
    return Token("float", float(text), i, text)


# ---------------------------------------------------------------------------------------------------------
# Parser + compiler
# ---------------------------------------------------------------------------------------------------------


class Node:
    """A compiled sub-expression: its evaluator plus what the compiler needs to know statically."""

    __slots__ = ("const", "fn", "is_const", "pred", "prop")

    def __init__(
        self,
        fn: Evaluator,
        *,
        is_const: bool = False,
        const: Any = None,
        pred: bool = False,
        prop: tuple[str, str] | None = None,
    ) -> None:
        self.fn = fn
        self.is_const = is_const
        self.const = const
        self.pred = pred  # evaluator already returns True/False/None
        self.prop = prop  # (scope, name) when the node is a bare property reference


def _constant(value: Any) -> Node:
    def const(_m: Message) -> Any:
        return value

    return Node(const, is_const=True, const=value)


def _folded(node: Node, *children: Node) -> Node:
    """Replace a node whose inputs are all constants by its value (left alone if evaluation fails)."""
    if all(c.is_const for c in children):
        try:
            value = node.fn(None)  # type: ignore[arg-type]  # constant sub-trees never read the message
        except Exception:
            return node
        folded = _constant(value)
        folded.pred = node.pred
        return folded
    return node


def _as_predicate(node: Node) -> Evaluator:
    """A bare expression used where a condition is expected is true only if it is the boolean TRUE."""
    if node.pred:
        return node.fn
    fn = node.fn

    def truth(m: Message) -> bool | None:
        v = fn(m)
        return v if isinstance(v, bool) else None

    return truth


_COMPARE_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
_SWAPPED = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _compile_compare(op: str, left: Node, right: Node) -> Node:
    if left.is_const and not right.is_const:  # keep the constant on the right for the fast paths
        left, right, op = right, left, _SWAPPED[op]
    fn_op = _COMPARE_OPS[op]
    lf, rf = left.fn, right.fn
    if right.is_const and not left.is_const:
        c = right.const
        if c is None:
            return Node(lambda m: None, pred=True)  # anything compared with NULL is unknown
        if type(c) is str:

            def cmp_str(m: Message) -> bool | None:
                v = lf(m)
                if type(v) is str:
                    return fn_op(v, c)
                return compare(fn_op, v, c)

            return Node(cmp_str, pred=True)
        if type(c) is int or type(c) is float:

            def cmp_num(m: Message) -> bool | None:
                v = lf(m)
                t = type(v)
                if t is int or t is float:
                    return fn_op(v, c)
                return compare(fn_op, v, c)

            return Node(cmp_num, pred=True)

        def cmp_const(m: Message) -> bool | None:
            return compare(fn_op, lf(m), c)

        return Node(cmp_const, pred=True)

    def cmp_any(m: Message) -> bool | None:
        return compare(fn_op, lf(m), rf(m))

    return _folded(Node(cmp_any, pred=True), left, right)


def _compile_and(left: Node, right: Node) -> Node:
    lf, rf = _as_predicate(left), _as_predicate(right)

    def and_(m: Message) -> bool | None:
        a = lf(m)
        if a is False:
            return False
        b = rf(m)
        if b is False:
            return False
        return True if a is True and b is True else None

    return _folded(Node(and_, pred=True), left, right)


def _compile_or(left: Node, right: Node) -> Node:
    lf, rf = _as_predicate(left), _as_predicate(right)

    def or_(m: Message) -> bool | None:
        a = lf(m)
        if a is True:
            return True
        b = rf(m)
        if b is True:
            return True
        return False if a is False and b is False else None

    return _folded(Node(or_, pred=True), left, right)


def _compile_not(inner: Node) -> Node:
    f = _as_predicate(inner)

    def not_(m: Message) -> bool | None:
        v = f(m)
        return None if v is None else not v

    return _folded(Node(not_, pred=True), inner)


def _negated(node: Node, negate_it: bool) -> Node:
    return _compile_not(node) if negate_it else node


class Parser:
    """Recursive-descent parser that emits compiled :class:`Node` closures directly."""

    def __init__(self, source: str, parameters: Mapping[str, Any], what: str) -> None:
        self.source = source
        self.what = what
        self.parameters = parameters
        self.tokens = tokenize(source, what)
        self.i = 0

    # --- token helpers -------------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def error(self, message: str, tok: Token | None = None) -> ArgumentError:
        tok = tok or self.tok
        return _syntax_error(self.what, self.source, tok.pos, message, tok.describe())

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def at_kw(self, *kws: str) -> bool:
        return self.tok.kind == "kw" and self.tok.value in kws

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            raise self.error(f"expected {op!r}")
        return self.advance()

    def expect_eof(self) -> None:
        if self.tok.kind != "eof":
            raise self.error("unexpected token")

    # --- grammar ---------------------------------------------------------------------------------------

    def parse_condition(self) -> Node:
        return self.parse_or()

    def parse_or(self) -> Node:
        node = self.parse_and()
        while self.at_kw("or"):
            self.advance()
            node = _compile_or(node, self.parse_and())
        return node

    def parse_and(self) -> Node:
        node = self.parse_not()
        while self.at_kw("and"):
            self.advance()
            node = _compile_and(node, self.parse_not())
        return node

    def parse_not(self) -> Node:
        if self.at_kw("not"):
            self.advance()
            return _compile_not(self.parse_not())
        return self.parse_comparison()

    def parse_comparison(self) -> Node:
        left = self.parse_additive()
        tok = self.tok
        if tok.kind == "op" and tok.value in _COMPARE_OPS:
            self.advance()
            return _compile_compare(tok.value, left, self.parse_additive())
        if self.at_kw("is"):
            self.advance()
            negate_it = False
            if self.at_kw("not"):
                self.advance()
                negate_it = True
            if not self.at_kw("null"):
                raise self.error("expected NULL after IS")
            self.advance()
            return self._is_null(left, negate_it)
        negate_it = False
        if self.at_kw("not"):
            nxt = self.tokens[self.i + 1]
            if not (nxt.kind == "kw" and nxt.value in ("in", "like")):
                raise self.error("expected IN or LIKE after NOT", nxt)
            self.advance()
            negate_it = True
        if self.at_kw("in"):
            self.advance()
            return _negated(self._in_list(left), negate_it)
        if self.at_kw("like"):
            self.advance()
            return _negated(self._like(left), negate_it)
        return left

    def parse_additive(self) -> Node:
        node = self.parse_multiplicative()
        while self.at_op("+", "-"):
            op = self.advance().value
            node = self._arith(op, node, self.parse_multiplicative())
        return node

    def parse_multiplicative(self) -> Node:
        node = self.parse_unary()
        while self.at_op("*", "/", "%"):
            op = self.advance().value
            node = self._arith(op, node, self.parse_unary())
        return node

    def parse_unary(self) -> Node:
        if self.at_op("-", "+"):
            op = self.advance().value
            if op == "-" and self.tok.kind == "int":
                tok = self.advance()
                if -tok.value < _INT64_MIN:
                    raise self.error("integer constant out of the Int64 range", tok)
                return _constant(-tok.value)
            inner = self.parse_unary()
            f = inner.fn
            node = Node(lambda m: negate(f(m))) if op == "-" else Node(lambda m: _plus(f(m)))
            return _folded(node, inner)
        return self.parse_primary()

    def parse_primary(self) -> Node:
        tok = self.tok
        kind = tok.kind
        if kind == "int":
            self.advance()
            if tok.value > _INT64_MAX:
                raise self.error("integer constant out of the Int64 range", tok)
            return _constant(tok.value)
        if kind in ("float", "str"):
            self.advance()
            return _constant(tok.value)
        if kind == "param":
            self.advance()
            key = tok.value.lower()
            if key not in self.parameters:
                raise _syntax_error(self.what, self.source, tok.pos, f"parameter {tok.text!r} has no value")
            return _constant(self.parameters[key])
        if kind == "kw":
            if tok.value in ("true", "false"):
                self.advance()
                node = _constant(tok.value == "true")
                node.pred = True
                return node
            if tok.value == "null":
                self.advance()
                return _constant(None)
            if tok.value == "exists":
                self.advance()
                self.expect_op("(")
                node = self._exists(self.parse_property())
                self.expect_op(")")
                return node
            raise self.error("expected an expression")
        if self.at_op("("):
            self.advance()
            node = self.parse_condition()
            self.expect_op(")")
            return node
        if kind == "ident" and self.tokens[self.i + 1].kind == "op" and self.tokens[self.i + 1].value == "(":
            return self.parse_function()
        if kind in ("ident", "qident"):
            return self._property_node(self.parse_property())
        raise self.error("expected an expression")

    def parse_property(self) -> tuple[str, str, Token]:
        """``[scope.]name`` -> (scope, name, first token). Scope is ``sys`` or ``user``."""
        tok = self.tok
        if tok.kind not in ("ident", "qident"):
            raise self.error("expected a property name")
        self.advance()
        if self.at_op("."):
            if tok.kind != "ident" or tok.value.lower() not in ("sys", "user"):
                raise self.error("unknown property scope (expected 'sys' or 'user')", tok)
            self.advance()
            name_tok = self.tok
            if name_tok.kind not in ("ident", "qident", "kw"):
                raise self.error("expected a property name after the scope")
            self.advance()
            name = name_tok.text if name_tok.kind == "kw" else name_tok.value
            scope = tok.value.lower()
            if scope == "sys" and name.lower() not in SYSTEM_GETTERS:
                raise _syntax_error(self.what, self.source, name_tok.pos, f"unknown system property 'sys.{name}'")
            return scope, name, tok
        return "user", tok.value, tok

    def parse_function(self) -> Node:
        tok = self.advance()
        name = tok.value.lower()
        self.expect_op("(")
        if name == "newid":
            self.expect_op(")")
            return Node(lambda m: uuid.uuid4())
        if name in ("property", "p"):
            arg = self.parse_additive()
            self.expect_op(")")
            if arg.is_const:
                ref = arg.const
                if not isinstance(ref, str):
                    raise self.error(f"{tok.text}() needs a string property name", tok)
                scope, _, rest = ref.partition(".")
                if rest and scope.lower() in ("sys", "user"):
                    if scope.lower() == "sys" and rest.lower() not in SYSTEM_GETTERS:
                        raise self.error(f"unknown system property {ref!r}", tok)
                    return self._property_node((scope.lower(), rest, tok))
                return self._property_node(("user", ref, tok))
            af = arg.fn
            return Node(lambda m: _resolve_dynamic(m, af(m)))
        raise self.error(f"unknown function {tok.text!r}", tok)

    # --- node builders ---------------------------------------------------------------------------------

    def _property_node(self, ref: tuple[str, str, Token]) -> Node:
        scope, name, _tok = ref
        if scope == "sys":
            return Node(SYSTEM_GETTERS[name.lower()], prop=(scope, name))
        return Node(_user_getter(name), prop=(scope, name))

    def _exists(self, ref: tuple[str, str, Token]) -> Node:
        scope, name, _tok = ref
        if scope == "sys":
            getter = SYSTEM_GETTERS[name.lower()]
            return Node(lambda m: getter(m) is not None, pred=True)
        return Node(_user_exists(name), pred=True)

    def _is_null(self, operand: Node, negate_it: bool) -> Node:
        f = operand.fn
        if negate_it:
            node = Node(lambda m: f(m) is not None, pred=True)
        else:
            node = Node(lambda m: f(m) is None, pred=True)
        return _folded(node, operand)

    def _arith(self, op: str, left: Node, right: Node) -> Node:
        lf, rf = left.fn, right.fn

        def arith(m: Message) -> Any:
            return arithmetic(op, lf(m), rf(m))

        return _folded(Node(arith), left, right)

    def _in_list(self, left: Node) -> Node:
        self.expect_op("(")
        items = [self.parse_additive()]
        while self.at_op(","):
            self.advance()
            items.append(self.parse_additive())
        self.expect_op(")")
        lf = left.fn
        if all(item.is_const for item in items):
            consts = tuple(item.const for item in items)
            strings = frozenset(c for c in consts if type(c) is str)
            others = tuple(c for c in consts if type(c) is not str and c is not None)

            def in_const(m: Message) -> bool | None:
                v = lf(m)
                if type(v) is str:
                    return v in strings
                if v is None:
                    return None
                if isinstance(v, str):
                    return str(v) in strings
                return any(values_equal(v, c) for c in others)

            return _folded(Node(in_const, pred=True), left)
        fns = tuple(item.fn for item in items)

        def in_any(m: Message) -> bool | None:
            v = lf(m)
            if v is None:
                return None
            return any(values_equal(v, f(m)) for f in fns)

        return Node(in_any, pred=True)

    def _like(self, left: Node) -> Node:
        pattern_tok = self.tok
        pattern = self.parse_additive()
        escape: Node | None = None
        if self.at_kw("escape"):
            esc_tok = self.advance()
            escape = self.parse_additive()
            if escape.is_const and not (isinstance(escape.const, str) and len(escape.const) == 1):
                raise self.error("ESCAPE needs a string of exactly one character", esc_tok)
        if pattern.is_const and not isinstance(pattern.const, str) and pattern.const is not None:
            raise self.error("LIKE needs a string pattern", pattern_tok)
        lf = left.fn
        if pattern.is_const and (escape is None or escape.is_const):
            if pattern.const is None:
                return Node(lambda m: None, pred=True)
            match = like_regex(pattern.const, None if escape is None else escape.const).fullmatch

            def like_const(m: Message) -> bool | None:
                v = lf(m)
                if type(v) is str or isinstance(v, str):
                    return match(v) is not None
                return None

            return _folded(Node(like_const, pred=True), left)
        pf = pattern.fn
        ef = escape.fn if escape is not None else None

        def like_any(m: Message) -> bool | None:
            v, p = lf(m), pf(m)
            e = ef(m) if ef is not None else None
            if not isinstance(v, str) or not isinstance(p, str):
                return None
            if ef is not None:
                if e is None:
                    return None
                if not (isinstance(e, str) and len(e) == 1):
                    raise EvaluationError("ESCAPE needs a string of exactly one character")
            return like_regex(p, e).fullmatch(v) is not None

        return Node(like_any, pred=True)


# ---------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------


def normalize_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parameter names without the leading '@', lower-cased (lookups are case-insensitive)."""
    result: dict[str, Any] = {}
    for key, value in (parameters or {}).items():
        if not isinstance(key, str) or not key.lstrip("@"):
            raise ArgumentError(f"Invalid SQL parameter name {key!r}")
        result[key.lstrip("@").lower()] = value
    return result


def _check_length(expression: Any, what: str) -> str:
    if not isinstance(expression, str):
        raise ArgumentError(f"The {what} must be a string, not {type(expression).__name__}")
    if not expression.strip():
        raise ArgumentError(f"The {what} is empty")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ArgumentError(
            f"The length of the {what} is {len(expression)}, which exceeds the maximum length of "
            f"{MAX_EXPRESSION_LENGTH}"
        )
    return expression


def compile_filter(expression: str, parameters: Mapping[str, Any] | None = None) -> Callable[[Message], bool]:
    """Compile a SQL filter into ``message -> bool``: true only when the condition is TRUE (not unknown).

    The evaluator raises :class:`EvaluationError` where the service raises a FilterException, so the caller
    can choose between "no match" and dead-lettering (DeadLetteringOnFilterEvaluationExceptions).
    """
    _check_length(expression, "SQL filter expression")
    parser = Parser(expression, normalize_parameters(parameters), "SQL filter expression")
    node = parser.parse_condition()
    parser.expect_eof()
    pred = _as_predicate(node)
    if node.is_const:
        value = pred(None)  # type: ignore[arg-type]
        return (lambda m: True) if value is True else (lambda m: False)

    def evaluate(m: Message) -> bool:
        try:
            return pred(m) is True
        except EvaluationError:
            raise
        except Exception as exc:  # anything else the operands provoke counts as an evaluation failure too
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from exc

    return evaluate


def _convert_system(kind: str, value: Any) -> Any:
    """Implicit conversion for a SET on a system property; raises EvaluationError when none exists."""
    if value is None:
        return None
    if kind == "str":
        if isinstance(value, str):
            return str(value)
        if isinstance(value, uuid.UUID):
            return str(value)
    elif kind == "timedelta":
        if isinstance(value, timedelta):
            return value
    elif kind == "datetime" and isinstance(value, datetime):
        return _utc(value)
    raise EvaluationError(f"cannot convert {type(value).__name__} to {kind}")


def _set_user(name: str, expr: Evaluator) -> Callable[[Message], None]:
    def set_user(m: Message) -> None:
        value = expr(m)
        props = m.application_properties
        if props is None:
            props = m.application_properties = {}
        key = find_user_key(props, name)
        if key is _MISSING:
            props[name] = value
            return
        old = props[key]
        if type(old) is float and type(value) is int:  # C#'s implicit long -> double conversion
            value = float(value)
        props[key] = value

    return set_user


def _remove_user(name: str) -> Callable[[Message], None]:
    lname = name.lower()

    def remove_user(m: Message) -> None:
        props = m.application_properties
        if props:
            for key in [k for k in props if isinstance(k, str) and k.lower() == lname]:
                del props[key]

    return remove_user


def _set_system(attr: str, kind: str, expr: Evaluator) -> Callable[[Message], None]:
    def set_system(m: Message) -> None:
        try:
            value = _convert_system(kind, expr(m))
        except Exception:
            return  # no implicit conversion: the statement has no effect
        setattr(m, attr, value)

    return set_system


def compile_action(expression: str, parameters: Mapping[str, Any] | None = None) -> Callable[[Message], None]:
    """Compile a SQL rule action (``SET p = expr`` / ``REMOVE p``, ';' optional) into ``message -> None``."""
    what = "SQL rule action"
    _check_length(expression, what)
    parser = Parser(expression, normalize_parameters(parameters), what)
    statements: list[Callable[[Message], None]] = []
    while parser.tok.kind != "eof":
        tok = parser.tok
        verb = tok.value.lower() if tok.kind == "ident" else None
        if verb not in ("set", "remove"):
            raise parser.error("expected SET or REMOVE")
        parser.advance()
        scope, name, name_tok = parser.parse_property()
        if scope == "sys":
            settable = SETTABLE_SYSTEM.get(name.lower())
            if settable is None:
                raise _syntax_error(what, expression, name_tok.pos, f"system property 'sys.{name}' cannot be changed")
        if verb == "set":
            parser.expect_op("=")
            value = parser.parse_condition()
            if scope == "sys":
                attr, kind = SETTABLE_SYSTEM[name.lower()]
                if value.is_const:
                    try:
                        _convert_system(kind, value.const)
                    except EvaluationError:
                        raise _syntax_error(
                            what,
                            expression,
                            name_tok.pos,
                            f"cannot assign {value.const!r} to 'sys.{name}'",
                        ) from None
                statements.append(_set_system(attr, kind, value.fn))
            else:
                statements.append(_set_user(name, value.fn))
        elif scope == "sys":
            attr, _kind = SETTABLE_SYSTEM[name.lower()]
            statements.append(_set_system(attr, "none", lambda m: None))
        else:
            statements.append(_remove_user(name))
        if len(statements) > MAX_ACTION_STATEMENTS:
            raise parser.error(f"a rule action holds at most {MAX_ACTION_STATEMENTS} statements")
        if parser.at_op(";"):
            parser.advance()
    if not statements:
        raise parser.error("expected SET or REMOVE")
    run = tuple(statements)

    def apply(m: Message) -> None:
        for statement in run:
            try:
                statement(m)
            except EvaluationError:
                continue  # a failed expression leaves that property as it was

    return apply
