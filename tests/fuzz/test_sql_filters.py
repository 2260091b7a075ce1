"""The SQL filter language with made-up expressions: from its grammar (identifiers, system properties, literals of
every type, operators, LIKE/IN/IS NULL/EXISTS, functions, parameters) and as mutated text. Each either parses or is
refused with ``ArgumentError`` (the admin API's 400, the $management argument-error); a parsed filter evaluates
against messages with properties of every type to True, False or unknown (None) and raises nothing else, and so
do SQL rule actions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus import Message, SqlFilter, SqlRuleAction
from shardbus.model.errors import ArgumentError
from shardbus.model.sqlfilter import EvaluationError

IDENTIFIERS = [
    "a",
    "b",
    "color",
    "sys.Label",
    "sys.MessageId",
    "sys.To",
    "sys.Size",
    "sys.DeliveryCount",
    "sys.EnqueuedTimeUtc",
    "user.a",
    "[weird name]",
    "sys.nope",
    "@p",
    "@q",
]
literals = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=8).map(lambda t: "'" + t.replace("'", "''") + "'"),
    st.sampled_from(["TRUE", "FALSE", "NULL", "1e308", "1e309", "-0.0", "'%'", "'_'", "9223372036854775808"]),
)
atoms = st.one_of(st.sampled_from(IDENTIFIERS), literals)


def _expressions():
    return st.recursive(
        atoms,
        lambda e: st.one_of(
            st.tuples(
                e, st.sampled_from(["=", "<>", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "AND", "OR"]), e
            ).map(" ".join),
            e.map(lambda x: f"NOT {x}"),
            e.map(lambda x: f"-{x}"),
            e.map(lambda x: f"({x})"),
            e.map(lambda x: f"{x} IS NULL"),
            e.map(lambda x: f"{x} IS NOT NULL"),
            st.tuples(e, literals).map(lambda t: f"{t[0]} LIKE {t[1]}"),
            st.tuples(e, literals, literals).map(lambda t: f"{t[0]} NOT LIKE {t[1]} ESCAPE {t[2]}"),
            st.tuples(e, st.lists(literals, min_size=1, max_size=3)).map(lambda t: f"{t[0]} IN ({', '.join(t[1])})"),
            st.sampled_from(IDENTIFIERS[:3]).map(lambda i: f"EXISTS({i})"),
            e.map(lambda x: f"newid() = {x}"),
            e.map(lambda x: f"property({x}) = 1"),
        ),
        max_leaves=10,
    )


mutations = st.builds(
    lambda text, at, junk: text[:at] + junk + text[at:],
    _expressions(),
    st.integers(0, 60),
    st.sampled_from(["(", ")", "'", "[", "]", ",", " AND", "@", ".", "\x00", "LIKE", "ESCAPE", "--", "/*", '"', "ü"]),
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=6),
    st.uuids(),
    st.datetimes(timezones=st.just(UTC), min_value=datetime(1, 1, 2)),
    st.binary(max_size=4),
    st.timedeltas(min_value=-timedelta(days=9), max_value=timedelta(days=9)),
)
messages = st.builds(
    lambda props, label: Message(b"x", application_properties=props, subject=label, message_id=str(uuid.uuid4())),
    st.dictionaries(st.sampled_from(["a", "b", "color", "weird name", "A"]), values, max_size=4),
    st.one_of(st.none(), st.text(max_size=5)),
)
parameters = st.dictionaries(st.sampled_from(["@p", "@q", "p", "@other"]), values, max_size=2)


@settings(max_examples=400, deadline=None, database=None)
@given(expression=st.one_of(_expressions(), mutations, st.text(max_size=40)), params=parameters, message=messages)
def test_filters_parse_or_are_refused_and_evaluate_without_surprises(expression, params, message):
    try:
        f = SqlFilter(expression, params or None)
    except ArgumentError:
        return
    try:
        result = f.evaluate(message)
    except EvaluationError:
        return  # what a subscription turns into a dead-lettered message (DeadLetteringOnFilterEvaluationExceptions)
    assert result in (True, False, None)
    assert f.matches(message) in (True, False)


@settings(max_examples=200, deadline=None, database=None)
@given(
    target=st.sampled_from(["a", "user.color", "sys.Label", "sys.To", "sys.nope", "[x y]"]),
    expression=st.one_of(_expressions(), st.text(max_size=20)),
    verb=st.sampled_from(["SET", "REMOVE", "set"]),
    message=messages,
)
def test_rule_actions_parse_or_are_refused_and_apply_without_surprises(target, expression, verb, message):
    text = f"{verb} {target}" if verb == "REMOVE" else f"{verb} {target} = {expression}"
    try:
        action = SqlRuleAction(text)
    except ArgumentError:
        return
    action.apply(message)  # a statement that cannot apply leaves its property as it was
