"""Subscription rule language: SQL filters, correlation filters, actions, routing and persistence."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardbus.model.errors import ArgumentError
from shardbus.model.filters import (
    RULE_NAME_PROPERTY,
    CorrelationFilter,
    EmptyRuleAction,
    EvaluationError,
    FalseFilter,
    Rule,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    action_from_dict,
    decode_value,
    encode_value,
    filter_from_dict,
    route,
    route_detailed,
)
from shardbus.model.message import Message


def msg(**props: Any) -> Message:
    """A message with the given user properties and a fixed set of system properties."""
    return Message(
        b"hello",
        message_id="m-1",
        correlation_id="corr-1",
        session_id="s-1",
        reply_to_session_id="rs-1",
        subject="Bus news",
        to="Store5",
        reply_to="reply@contoso.com",
        content_type="application/json",
        partition_key="s-1",
        time_to_live=timedelta(minutes=5),
        scheduled_enqueue_time=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        application_properties=dict(props),
        sequence_number=42,
        enqueued_time_ms=1_700_000_000_000,
        delivery_count=3,
    )


def sql(expression: str, message: Message | None = None, **params: Any) -> bool:
    return SqlFilter(expression, params or None).matches(message if message is not None else msg())


# ---------------------------------------------------------------------------------------------------------
# Literals, properties, comparison
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "1 = 1",
        "'abc' = 'abc'",
        "'it''s' = 'it''s'",
        "2.5 > 2",
        "1 = 1.0",
        "101.5E5 = 10150000",
        "0.5E-2 = 0.005",
        ".5 = 0.5",
        "TRUE = TRUE",
        "true <> false",
        "1 <> 2",
        "1 != 2",
        "1 < 2",
        "2 <= 2",
        "3 > 2",
        "2 >= 2",
        "'a' < 'b'",
        "TRUE",
    ],
)
def test_constant_comparisons_true(expression: str) -> None:
    assert sql(expression)


@pytest.mark.parametrize("expression", ["1 = 2", "'a' = 'A'", "FALSE", "2 < 1", "'b' <= 'a'"])
def test_constant_comparisons_false(expression: str) -> None:
    assert not sql(expression)


def test_user_property_bare_scoped_bracketed_and_quoted() -> None:
    m = msg(color="red", **{"Property With Space": 1, "HR-EmployeeID": "e1", "Contoso & Northwind": "x"})
    assert sql("color = 'red'", m)
    assert sql("user.color = 'red'", m)
    assert sql("[Property With Space] = 1", m)
    assert sql("user.[HR-EmployeeID] = 'e1'", m)
    assert sql("\"Contoso & Northwind\" = 'x'", m)
    assert sql("[a]]b] = 2", msg(**{"a]b": 2}))


def test_property_names_are_case_insensitive_values_are_not() -> None:
    m = msg(Color="Red")
    assert sql("color = 'Red'", m)
    assert sql("COLOR = 'Red'", m)
    assert not sql("color = 'red'", m)
    assert sql("sys.label = 'Bus news'", m)
    assert sql("SYS.LABEL = 'Bus news'", m)


def test_keywords_are_case_insensitive() -> None:
    assert sql("a = 1 and not b is null Or c In (1)", msg(a=1, b=2))
    assert sql("a LiKe 'x%' EsCaPe '!'", msg(a="xyz"))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("sys.MessageId = 'm-1'", True),
        ("sys.CorrelationId = 'corr-1'", True),
        ("sys.To = 'Store5'", True),
        ("sys.ReplyTo = 'reply@contoso.com'", True),
        ("sys.Label = 'Bus news'", True),
        ("sys.Subject = 'Bus news'", True),
        ("sys.SessionId = 's-1'", True),
        ("sys.ReplyToSessionId = 'rs-1'", True),
        ("sys.ContentType = 'application/json'", True),
        ("sys.PartitionKey = 's-1'", True),
        ("sys.SequenceNumber = 42", True),
        ("sys.DeliveryCount > 2", True),
        ("sys.Size = 5", True),
        ("sys.TimeToLive = @ttl", True),
        ("sys.ScheduledEnqueueTimeUtc = @sched", True),
        ("sys.EnqueuedTimeUtc = @enq", True),
        ("sys.EnqueuedTimeUtc < @sched", True),
        ("sys.DeadLetterSource IS NULL", True),
    ],
)
def test_system_properties(expression: str, expected: bool) -> None:
    params = {
        "@ttl": timedelta(minutes=5),
        "@sched": datetime(2024, 1, 2, 3, 4, 5),  # naive: taken as UTC
        "@enq": datetime.fromtimestamp(1_700_000_000, UTC),
    }
    assert SqlFilter(expression, params).matches(msg()) is expected


def test_unset_system_property_is_null() -> None:
    m = Message(b"")
    assert sql("sys.To IS NULL", m)
    assert not sql("sys.To = 'x'", m)
    assert not sql("NOT sys.To = 'x'", m)


def test_comparing_unrelated_types_is_unknown() -> None:
    m = msg(n=10, s="10", b=True)
    assert not sql("s = 10", m)
    assert not sql("NOT s = 10", m)
    assert not sql("b = 1", m)
    assert not sql("b > FALSE", m)  # booleans only support = and <>
    assert sql("b = TRUE", m)
    assert sql("n = 10.0", m)


def test_int_and_float_mix_in_comparisons() -> None:
    m = msg(i=3, f=2.5)
    assert sql("i > f", m)
    assert sql("f < 3", m)
    assert sql("i = 3.0", m)


def test_datetime_and_timespan_values() -> None:
    start = datetime(2024, 5, 1, tzinfo=UTC)
    m = msg(a=start, b=start + timedelta(hours=2))
    assert sql("b - a <= @span", m, span=timedelta(hours=2))
    assert not sql("(b - a) < @span", m, span=timedelta(hours=2))
    assert sql("a + @span = b", m, span=timedelta(hours=2))
    assert sql("a < @dt", m, dt=datetime(2024, 6, 1))


def test_uuid_equality() -> None:
    u = uuid.uuid4()
    assert sql("id = @u", msg(id=u), u=u)
    assert not sql("id = @u", msg(id=uuid.uuid4()), u=u)


# ---------------------------------------------------------------------------------------------------------
# Three-valued logic
# ---------------------------------------------------------------------------------------------------------

T, F, U = "1 = 1", "1 = 0", "missing = 1"


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [(T, T, True), (T, F, False), (T, U, None), (F, F, False), (F, U, False), (U, U, None), (U, F, False)],
)
def test_and_truth_table(left: str, right: str, expected: bool | None) -> None:
    assert sql(f"({left}) AND ({right})") is (expected is True)
    # NOT distinguishes false (-> true) from unknown (-> unknown)
    assert sql(f"NOT (({left}) AND ({right}))") is (expected is False)


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [(T, T, True), (T, F, True), (T, U, True), (U, T, True), (F, F, False), (F, U, None), (U, U, None)],
)
def test_or_truth_table(left: str, right: str, expected: bool | None) -> None:
    assert sql(f"({left}) OR ({right})") is (expected is True)
    assert sql(f"NOT (({left}) OR ({right}))") is (expected is False)


def test_unknown_propagates_through_arithmetic_and_comparison() -> None:
    assert not sql("missing + 1 > 0")
    assert not sql("NOT (missing + 1 > 0)")
    assert not sql("-missing < 0")
    assert not sql("missing = NULL")
    assert not sql("NOT missing = NULL")
    assert not sql("1 = NULL")
    assert not sql("missing <> 'x'")
    assert sql("missing <> 'x' OR 1 = 1")


def test_null_valued_property_behaves_like_unknown() -> None:
    m = msg(p=None)
    assert not sql("p = 1", m)
    assert not sql("NOT p = 1", m)
    assert sql("p IS NULL", m)
    assert sql("EXISTS(p)", m)


# ---------------------------------------------------------------------------------------------------------
# IS NULL, EXISTS, IN, LIKE
# ---------------------------------------------------------------------------------------------------------


def test_is_null_and_is_not_null() -> None:
    m = msg(a=1)
    assert sql("b IS NULL", m)
    assert not sql("a IS NULL", m)
    assert sql("a IS NOT NULL", m)
    assert not sql("b IS NOT NULL", m)
    assert sql("sys.To IS NOT NULL", m)


def test_exists() -> None:
    m = msg(a=1)
    assert sql("EXISTS(a)", m)
    assert sql("EXISTS (user.A)", m)
    assert not sql("EXISTS(b)", m)
    assert sql("NOT EXISTS(b)", m)
    assert sql("EXISTS(sys.To)", m)
    assert not sql("EXISTS(sys.DeadLetterSource)", m)
    assert not sql("EXISTS(a)", Message(b""))


def test_in_and_not_in() -> None:
    m = msg(store="Store2", n=2)
    assert sql("store IN ('Store1', 'Store2', 'Store3')", m)
    assert not sql("store IN ('store2')", m)
    assert sql("store NOT IN ('Store1', 'Store3')", m)
    assert sql("n IN (1, 2.0, 3)", m)
    assert sql("n NOT IN (1, 3)", m)
    assert sql("n IN (1, n + 0)", m)
    assert sql("sys.To IN ('Store5','Store6','Store7') OR StoreId = 'Store8'", m)
    assert not sql("missing IN ('a')", m)
    assert not sql("missing NOT IN ('a')", m)
    assert not sql("TRUE IN (1)", m)  # a boolean never equals a number


@pytest.mark.parametrize(
    ("value", "pattern", "expected"),
    [
        ("Bus news", "%bus%", False),
        ("Bus news", "%Bus%", True),
        ("abc", "a_c", True),
        ("abc", "a_", False),
        ("abc", "abc", True),
        ("", "%", True),
        ("a\nb", "a%b", True),
        ("a.c", "a.c", True),
        ("abc", "a.c", False),
        ("50% off", "50!% off", False),
        ("ABC%", "ABC\\%", False),
    ],
)
def test_like(value: str, pattern: str, expected: bool) -> None:
    assert sql("v LIKE @p", msg(v=value), p=pattern) is expected
    assert sql(f"v LIKE '{pattern}'", msg(v=value)) is expected
    assert sql(f"v NOT LIKE '{pattern}'", msg(v=value)) is (not expected)


def test_like_escape() -> None:
    assert sql("v LIKE 'ABC\\%' ESCAPE '\\'", msg(v="ABC%"))
    assert not sql("v LIKE 'ABC\\%' ESCAPE '\\'", msg(v="ABCD"))
    assert sql("v LIKE '50!% off' ESCAPE '!'", msg(v="50% off"))
    assert sql("v LIKE 'a!_c' ESCAPE '!'", msg(v="a_c"))
    assert not sql("v LIKE 'a!_c' ESCAPE '!'", msg(v="abc"))
    assert sql("v LIKE p ESCAPE e", msg(v="a%", p="a#%", e="#"))


def test_like_with_non_string_or_unknown_operand_is_unknown() -> None:
    assert not sql("n LIKE '1%'", msg(n=12))
    assert not sql("n NOT LIKE '1%'", msg(n=12))
    assert not sql("missing LIKE '%'")
    assert not sql("missing NOT LIKE '%'")
    assert not sql("v LIKE p", msg(v="a"))


def test_dynamic_like_with_bad_escape_fails_evaluation() -> None:
    f = SqlFilter("v LIKE 'a' ESCAPE e")
    assert not f.matches(msg(v="a", e="ab"))
    with pytest.raises(EvaluationError):
        f.evaluate(msg(v="a", e="ab"))


# ---------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "1 + 2 = 3",
        "5 - 7 = -2",
        "3 * 4 = 12",
        "7 / 2 = 3",  # long division truncates
        "-7 / 2 = -3",  # toward zero
        "7 % 3 = 1",
        "-7 % 3 = -1",  # C# remainder takes the dividend's sign
        "7.0 / 2 = 3.5",
        "7 / 2.0 = 3.5",
        "5.5 % 2 = 1.5",
        "-(2) = -2",
        "+2 = 2",
        "- -2 = 2",
        "2 + 3 * 4 = 14",
        "(2 + 3) * 4 = 20",
        "10 - 2 - 3 = 5",
        "2 * 3 % 4 = 2",
        "'ab' + 'cd' = 'abcd'",
        "'n' + 1 = 'n1'",
        "9223372036854775807 + 1 = -9223372036854775808",
        "1.0 / 0 > 1000000",
    ],
)
def test_arithmetic(expression: str) -> None:
    assert sql(expression)


def test_arithmetic_on_properties() -> None:
    m = msg(quantity=10, price=2.5)
    assert sql("quantity * price = 25.0", m)
    assert sql("quantity / 4 = 2", m)
    assert sql("quantity % 4 = 2", m)
    assert sql("-quantity = -10", m)
    assert not sql("quantity + 'x' = 1", m)


def test_arithmetic_on_unrelated_types_is_unknown() -> None:
    m = msg(b=True, s="x")
    assert not sql("b + 1 = 2", m)
    assert not sql("NOT (b + 1 = 2)", m)
    assert not sql("s * 2 = 'xx'", m)
    assert not sql("-s = 'x'", m)


def test_integer_division_by_zero_is_an_evaluation_error() -> None:
    f = SqlFilter("n / 0 = 1 OR 1 = 1")
    m = msg(n=4)
    assert not f.matches(m)
    with pytest.raises(EvaluationError):
        f.evaluate(m)
    assert not sql("n % z = 1", msg(n=4, z=0))


# ---------------------------------------------------------------------------------------------------------
# Parameters and functions
# ---------------------------------------------------------------------------------------------------------


def test_parameters_of_every_supported_type() -> None:
    u = uuid.uuid4()
    m = msg(s="orders", i=5, f=1.5, b=False, d=datetime(2024, 1, 1, tzinfo=UTC), t=timedelta(seconds=3), u=u)
    params = {
        "@s": "orders",
        "@i": 5,
        "@f": 1.5,
        "@b": False,
        "@d": datetime(2024, 1, 1, tzinfo=UTC),
        "@t": timedelta(seconds=3),
        "@u": u,
    }
    f = SqlFilter("s = @s AND i = @i AND f = @f AND b = @b AND d = @d AND t = @t AND u = @u", params)
    assert f.matches(m)


def test_parameter_names_with_or_without_at_and_case_insensitive() -> None:
    assert SqlFilter("source = @stringParam", {"@stringParam": "orders"}).matches(msg(source="orders"))
    assert SqlFilter("source = @STRINGPARAM", {"stringparam": "orders"}).matches(msg(source="orders"))


def test_missing_parameter_is_rejected() -> None:
    with pytest.raises(ArgumentError, match="@nope"):
        SqlFilter("a = @nope", {"@other": 1})


def test_unsupported_parameter_type_is_rejected() -> None:
    with pytest.raises(ArgumentError, match="unsupported type"):
        SqlFilter("a = @p", {"@p": [1, 2]})


def test_property_function() -> None:
    m = msg(**{"my prop": 3, "name": "my prop"})
    assert sql("property('my prop') = 3", m)
    assert sql("p('my prop') = 3", m)
    assert sql("property('sys.Label') = 'Bus news'", m)
    assert sql("property('user.my prop') = 3", m)
    assert sql("property(name) = 3", m)  # computed name
    assert sql("property('sys.' + 'To') = 'Store5'", m)
    assert not sql("property('nothing') = 3", m)


def test_property_function_with_unknown_system_property() -> None:
    with pytest.raises(ArgumentError, match="unknown system property"):
        SqlFilter("property('sys.Nope') = 1")
    f = SqlFilter("property(n) = 1")
    with pytest.raises(EvaluationError):
        f.evaluate(msg(n="sys.Nope"))


def test_newid() -> None:
    assert sql("newid() IS NOT NULL")
    assert not sql("newid() = newid()")


# ---------------------------------------------------------------------------------------------------------
# Syntax errors
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("color =", "position 8"),
        ("= 1", "position 1 near '='"),
        ("a = 1 b", "position 7 near 'b'"),
        ("(a = 1", "expected ')'"),
        ("a = 1)", "near ')'"),
        ("a = 'abc", "unterminated string literal at position 5"),
        ("[abc = 1", "unterminated delimited identifier"),
        ('"abc = 1', "unterminated quoted identifier"),
        ("[] = 1", "empty delimited identifier"),
        ("a = #", "unexpected character '#'"),
        ("a = 12abc", "invalid number '12abc'"),
        ("a = 1.2.3", "invalid number"),
        ("a = @", "'@' must be followed"),
        ("a == 1", "position 4 near '='"),
        ("a = 1 AND", "end of expression"),
        ("a IS 1", "expected NULL"),
        ("a NOT = 1", "expected IN or LIKE"),
        ("a IN ()", "near ')'"),
        ("a IN 1", "expected '('"),
        ("a LIKE 1", "LIKE needs a string pattern"),
        ("a LIKE 'x' ESCAPE 'ab'", "ESCAPE needs a string of exactly one character"),
        ("EXISTS(1)", "expected a property name"),
        ("EXISTS a", "expected '('"),
        ("foo.bar = 1", "unknown property scope"),
        ("sys.Nope = 1", "unknown system property 'sys.Nope'"),
        ("nofunc(1) = 1", "unknown function 'nofunc'"),
        ("newid(1) = 1", "expected ')'"),
        ("and = 1", "near 'and'"),
        ("a = 99999999999999999999", "Int64"),
        ("a = 1 = 1", "near '='"),
        ("SET a = 1", "near 'a'"),
    ],
)
def test_filter_syntax_errors(expression: str, fragment: str) -> None:
    with pytest.raises(ArgumentError) as info:
        SqlFilter(expression)
    assert fragment in str(info.value)


def test_filter_length_limit() -> None:
    long_expression = "a = '" + "x" * 1020 + "'"
    with pytest.raises(ArgumentError, match="exceeds the maximum length of 1024"):
        SqlFilter(long_expression)
    SqlFilter("a = '" + "x" * 1018 + "'")  # exactly 1024 characters


def test_int64_min_literal() -> None:
    assert sql("-9223372036854775808 < 0")


def test_keyword_allowed_as_property_via_brackets_or_scope() -> None:
    m = msg(**{"and": 1, "like": 2})
    assert sql("[and] = 1 AND user.like = 2", m)


# ---------------------------------------------------------------------------------------------------------
# Boolean and correlation filters
# ---------------------------------------------------------------------------------------------------------


def test_true_and_false_filters() -> None:
    assert TrueFilter().matches(msg())
    assert not FalseFilter().matches(msg())
    assert isinstance(TrueFilter(), SqlFilter)
    assert TrueFilter().expression == "1=1"
    assert FalseFilter().expression == "1=0"


def test_correlation_filter_system_fields() -> None:
    m = msg()
    assert CorrelationFilter(correlation_id="corr-1").matches(m)
    assert not CorrelationFilter(correlation_id="CORR-1").matches(m)  # case-sensitive
    assert CorrelationFilter(
        correlation_id="corr-1",
        message_id="m-1",
        to="Store5",
        reply_to="reply@contoso.com",
        subject="Bus news",
        session_id="s-1",
        reply_to_session_id="rs-1",
        content_type="application/json",
    ).matches(m)
    assert not CorrelationFilter(correlation_id="corr-1", to="Store6").matches(m)
    assert not CorrelationFilter(to="x").matches(Message(b""))


def test_correlation_filter_properties() -> None:
    m = msg(color="Red", quantity=10, flag=True)
    assert CorrelationFilter(properties={"color": "Red"}).matches(m)
    assert CorrelationFilter(properties={"COLOR": "Red"}).matches(m)  # names are case-insensitive
    assert not CorrelationFilter(properties={"color": "red"}).matches(m)
    assert CorrelationFilter(properties={"quantity": 10.0, "flag": True}).matches(m)
    assert not CorrelationFilter(properties={"quantity": "10"}).matches(m)
    assert not CorrelationFilter(properties={"flag": 1}).matches(m)
    assert not CorrelationFilter(properties={"missing": "x"}).matches(m)
    assert not CorrelationFilter(properties={"color": "Red"}).matches(Message(b""))
    combined = CorrelationFilter(subject="Bus news", reply_to="reply@contoso.com", properties={"color": "Red"})
    assert combined.matches(m)
    assert not combined.matches(msg(color="Blue"))


def test_correlation_filter_needs_a_condition() -> None:
    with pytest.raises(ArgumentError, match="at least one"):
        CorrelationFilter()


def test_correlation_filter_equivalent_to_sql() -> None:
    corr = CorrelationFilter(subject="Important", reply_to="johndoe@contoso.com", properties={"color": "Red"})
    expression = SqlFilter("sys.ReplyTo = 'johndoe@contoso.com' AND sys.Label = 'Important' AND color = 'Red'")
    for m in [
        Message(subject="Important", reply_to="johndoe@contoso.com", application_properties={"color": "Red"}),
        Message(subject="Important", reply_to="johndoe@contoso.com", application_properties={"color": "red"}),
        Message(subject="Important", application_properties={"color": "Red"}),
    ]:
        assert corr.matches(m) is expression.matches(m)


# ---------------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------------


def applied(action: str, message: Message | None = None, **params: Any) -> Message:
    copy = (message or msg()).copy()
    SqlRuleAction(action, params or None).apply(copy)
    return copy


def test_set_and_remove_user_properties() -> None:
    m = applied(
        "SET quantity = quantity / 2; REMOVE priority;SET sys.CorrelationId = 'low';",
        msg(quantity=10, priority="high"),
    )
    assert m.application_properties == {"quantity": 5}
    assert m.correlation_id == "low"


def test_statements_without_semicolons_and_new_properties() -> None:
    m = applied("SET a = 1 SET user.b = 'two' SET [c d] = a + 1", Message(b""))
    assert m.application_properties == {"a": 1, "b": "two", "c d": 2}


def test_set_updates_existing_property_case_insensitively() -> None:
    m = applied("SET COLOR = 'blue'", msg(Color="red"))
    assert m.application_properties == {"Color": "blue"}
    m = applied("REMOVE COLOR", msg(Color="red", other=1))
    assert m.application_properties == {"other": 1}


def test_set_converts_long_to_existing_double() -> None:
    m = applied("SET price = 3", msg(price=2.5))
    assert m.application_properties["price"] == 3.0
    assert type(m.application_properties["price"]) is float


def test_set_from_unknown_stores_null() -> None:
    m = applied("SET a = missing + 1", msg())
    assert m.application_properties == {"a": None}


def test_set_with_parameters_and_functions() -> None:
    m = applied("SET source = @p; SET id = newid(); SET sys.MessageId = newid()", msg(), p="routed")
    assert m.application_properties["source"] == "routed"
    assert isinstance(m.application_properties["id"], uuid.UUID)
    uuid.UUID(m.message_id)  # a GUID converts to the string MessageId


def test_set_each_settable_system_property() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    m = applied(
        "SET sys.MessageId = 'x1'; SET sys.CorrelationId = 'x2'; SET sys.SessionId = 'x3';"
        "SET sys.ReplyToSessionId = 'x4'; SET sys.Label = 'x5'; SET sys.To = 'x6'; SET sys.ReplyTo = 'x7';"
        "SET sys.ContentType = 'x8'; SET sys.PartitionKey = 'x3'; SET sys.TimeToLive = @ttl;"
        "SET sys.ScheduledEnqueueTimeUtc = @when",
        ttl=timedelta(seconds=30),
        when=when,
    )
    assert (m.message_id, m.correlation_id, m.session_id, m.reply_to_session_id) == ("x1", "x2", "x3", "x4")
    assert (m.subject, m.to, m.reply_to, m.content_type, m.partition_key) == ("x5", "x6", "x7", "x8", "x3")
    assert m.time_to_live == timedelta(seconds=30)
    assert m.scheduled_enqueue_time == when
    assert applied("SET sys.Subject = 'y'").subject == "y"


def test_set_system_property_from_user_property_and_label_concat() -> None:
    m = applied("SET sys.Label = sys.Label + ' (routed)'; SET sys.To = store", msg(store="Store9"))
    assert m.subject == "Bus news (routed)"
    assert m.to == "Store9"


def test_remove_system_property_clears_it() -> None:
    m = applied("REMOVE sys.To; REMOVE sys.TimeToLive")
    assert m.to is None
    assert m.time_to_live is None


def test_set_system_property_without_conversion_has_no_effect() -> None:
    m = applied("SET sys.To = n; SET a = 1", msg(n=5))
    assert m.to == "Store5"
    assert m.application_properties["a"] == 1


def test_failing_statement_is_skipped() -> None:
    m = applied("SET a = 1 / z; SET b = 2", msg(z=0))
    assert "a" not in m.application_properties
    assert m.application_properties["b"] == 2


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty"),
        ("quantity = 1", "expected SET or REMOVE"),
        ("SET", "expected a property name"),
        ("SET a", "expected '='"),
        ("SET a =", "expected an expression"),
        ("SET a = 1,", "expected SET or REMOVE at position 10 near ','"),
        ("REMOVE", "expected a property name"),
        ("REMOVE 'a'", "expected a property name"),
        ("SET sys.SequenceNumber = 1", "cannot be changed"),
        ("REMOVE sys.EnqueuedTimeUtc", "cannot be changed"),
        ("SET sys.Nope = 1", "unknown system property"),
        ("SET sys.To = 5", "cannot assign 5"),
        ("SET sys.TimeToLive = 'x'", "cannot assign"),
        ("SET a = @missing", "@missing"),
        (";".join(["SET a = 1"] * 33), "at most 32"),
    ],
)
def test_action_syntax_errors(expression: str, fragment: str) -> None:
    with pytest.raises(ArgumentError) as info:
        SqlRuleAction(expression)
    assert fragment in str(info.value)


def test_action_is_applied_in_order() -> None:
    m = applied("SET a = 1; SET a = a + 1; SET b = a * 10", Message(b""))
    assert m.application_properties == {"a": 2, "b": 20}


# ---------------------------------------------------------------------------------------------------------
# Rules and routing
# ---------------------------------------------------------------------------------------------------------


def test_no_matching_rule_yields_nothing() -> None:
    assert route([Rule("r", SqlFilter("color = 'blue'"))], msg(color="red")) == []
    assert route([], msg()) == []


def test_default_rule_delivers_a_copy() -> None:
    m = msg(color="red")
    copies = route([Rule("$Default")], m)
    assert len(copies) == 1
    assert copies[0] is not m
    assert copies[0].application_properties == {"color": "red"}
    assert RULE_NAME_PROPERTY not in copies[0].application_properties


def test_rules_without_actions_are_ored_into_one_copy() -> None:
    rules = [
        Rule("a", SqlFilter("color = 'red'")),
        Rule("b", CorrelationFilter(properties={"color": "red"})),
        Rule("c", TrueFilter()),
    ]
    assert len(route(rules, msg(color="red"))) == 1
    assert len(route(rules[:2], msg(color="blue"))) == 0


def test_five_rules_two_with_actions_give_three_copies() -> None:
    """The docs' example: two action rules and three plain rules all matching -> three messages."""
    original = msg(color="red", quantity=10)
    rules = [
        Rule("plain1", SqlFilter("color = 'red'")),
        Rule("act1", SqlFilter("quantity > 5"), SqlRuleAction("SET quantity = quantity / 2")),
        Rule("plain2", TrueFilter()),
        Rule("act2", TrueFilter(), SqlRuleAction("SET sys.Label = 'tagged'; REMOVE color")),
        Rule("plain3", CorrelationFilter(correlation_id="corr-1")),
    ]
    copies = route(rules, original)
    assert len(copies) == 3
    plain, act1, act2 = copies
    assert plain.application_properties == {"color": "red", "quantity": 10}
    assert act1.application_properties == {"color": "red", "quantity": 5, RULE_NAME_PROPERTY: "act1"}
    assert act2.application_properties == {"quantity": 10, RULE_NAME_PROPERTY: "act2"}
    assert act2.subject == "tagged"
    # the topic's message is untouched
    assert original.application_properties == {"color": "red", "quantity": 10}
    assert original.subject == "Bus news"
    assert len({id(c) for c in copies}) == 3


def test_only_matching_action_rules_produce_copies() -> None:
    rules = [
        Rule("act-red", SqlFilter("color = 'red'"), SqlRuleAction("SET tag = 'r'")),
        Rule("act-blue", SqlFilter("color = 'blue'"), SqlRuleAction("SET tag = 'b'")),
    ]
    copies = route(rules, msg(color="blue"))
    assert [c.application_properties["tag"] for c in copies] == ["b"]
    assert copies[0].application_properties[RULE_NAME_PROPERTY] == "act-blue"


def test_action_rule_copy_on_message_without_properties() -> None:
    copies = route([Rule("r", TrueFilter(), SqlRuleAction("SET x = 1"))], Message(b"body"))
    assert copies[0].application_properties == {"x": 1, RULE_NAME_PROPERTY: "r"}
    assert copies[0].body == b"body"


def test_empty_action_counts_as_no_action() -> None:
    rules = [Rule("a", TrueFilter(), EmptyRuleAction()), Rule("b", TrueFilter(), None)]  # type: ignore[arg-type]
    assert len(route(rules, msg())) == 1


def test_filter_evaluation_errors_are_reported() -> None:
    rules = [
        Rule("bad", SqlFilter("n / 0 = 1")),
        Rule("good", SqlFilter("n = 4"), SqlRuleAction("SET x = 1")),
    ]
    result = route_detailed(rules, msg(n=4))
    assert [c.application_properties[RULE_NAME_PROPERTY] for c in result.copies] == ["good"]
    assert result.errors and result.errors[0][0] == "bad"
    assert "division by zero" in result.errors[0][1]


def test_rule_validation() -> None:
    with pytest.raises(ArgumentError):
        Rule("")
    with pytest.raises(ArgumentError):
        Rule("r", "color = 'red'")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Serialization
# ---------------------------------------------------------------------------------------------------------


ALL_VALUES: dict[str, Any] = {
    "@s": "x",
    "@i": 7,
    "@big": 2**62,
    "@f": 1.25,
    "@inf": float("inf"),
    "@b": True,
    "@n": None,
    "@dt": datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    "@naive": datetime(2024, 1, 2, 3, 4, 5),
    "@td": timedelta(days=-1, seconds=5, microseconds=7),
    "@u": uuid.UUID(int=5),
    "@bytes": b"\x00\x01",
}


@pytest.mark.parametrize(
    "rule_filter",
    [
        TrueFilter(),
        FalseFilter(),
        SqlFilter("color = 'red' AND quantity > 10"),
        SqlFilter("a = @s OR b = @i OR c = @dt", ALL_VALUES),
        CorrelationFilter(correlation_id="c", subject="s", properties={"color": "red", "when": ALL_VALUES["@dt"]}),
        CorrelationFilter(
            correlation_id="c",
            message_id="m",
            to="t",
            reply_to="r",
            session_id="s",
            reply_to_session_id="rs",
            content_type="ct",
        ),
    ],
)
def test_filter_round_trip(rule_filter: Any) -> None:
    data = json.loads(json.dumps(rule_filter.to_dict(), allow_nan=False))
    rebuilt = filter_from_dict(data)
    assert type(rebuilt) is type(rule_filter)
    assert rebuilt == rule_filter
    assert rebuilt.to_dict() == rule_filter.to_dict()


def test_parameters_survive_round_trip_exactly() -> None:
    f = SqlFilter("a = @s", ALL_VALUES)
    rebuilt = filter_from_dict(json.loads(json.dumps(f.to_dict(), allow_nan=False)))
    assert isinstance(rebuilt, SqlFilter)
    assert rebuilt.parameters == ALL_VALUES
    assert {k: type(v) for k, v in rebuilt.parameters.items()} == {k: type(v) for k, v in ALL_VALUES.items()}


@pytest.mark.parametrize("action", [EmptyRuleAction(), SqlRuleAction("SET a = @p; REMOVE b", {"@p": 1.5})])
def test_action_round_trip(action: Any) -> None:
    data = json.loads(json.dumps(action.to_dict()))
    assert action_from_dict(data) == action
    assert action_from_dict(None) == EmptyRuleAction()


def test_rule_round_trip() -> None:
    rule = Rule(
        "RedOrdersWithAction",
        SqlFilter("user.color = @c", {"@c": "red"}),
        SqlRuleAction("SET quantity = quantity / 2; REMOVE priority; SET sys.CorrelationId = 'low'"),
    )
    data = json.loads(json.dumps(rule.to_dict()))
    rebuilt = Rule.from_dict(data)
    assert rebuilt == rule
    m = msg(color="red", quantity=8, priority="high")
    assert [c.application_properties for c in route([rebuilt], m)] == [
        {"color": "red", "quantity": 4, RULE_NAME_PROPERTY: "RedOrdersWithAction"}
    ]
    assert Rule.from_dict({"name": "$Default"}) == Rule("$Default")


@pytest.mark.parametrize(
    "data",
    [
        {"type": "nope"},
        {"type": "sql", "expression": "a ="},
        {"type": "sql"},
        {"type": "correlation"},
        {"type": "sql", "expression": "a = @p", "parameters": {"@p": {"$type": "martian", "value": 1}}},
        {"type": "sql", "expression": "a = @p", "parameters": {"@p": {"$type": "datetime", "value": "nope"}}},
    ],
)
def test_bad_filter_dicts(data: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError):
        filter_from_dict(data)


def test_bad_action_and_rule_dicts() -> None:
    with pytest.raises(ArgumentError):
        action_from_dict({"type": "mystery"})
    with pytest.raises(ArgumentError):
        Rule.from_dict({"filter": {"type": "true"}})


def test_encode_value_rejects_unsupported_types() -> None:
    with pytest.raises(ArgumentError):
        encode_value({"a": 1})
    nan = decode_value(json.loads(json.dumps(encode_value(float("nan")), allow_nan=False)))
    assert nan != nan  # NaN survives as NaN
