"""Rule management over AMQP: com.microsoft:add-rule / remove-rule / enumerate-rules on a subscription's
``$management`` node, in the wire format of the service's official clients (see ``endpoint/rules.py``).

The azure-servicebus Python SDK declares the three operation names but never sends them (it manages rules over
HTTPS only), so these tests speak the protocol with ``AmqpClient``: request bodies are built exactly as
Azure.Messaging.ServiceBus ``AmqpMessageConverter.GetRuleDescriptionMap`` and Java ``encodeRuleOptionToMap`` build
them, and responses are also checked through the SDK's own AMQP decoder.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._pyamqp._decode import decode_payload

from management_wire import Reply, management
from shardbus.amqp import codec
from shardbus.amqp.message import AmqpMessage, Properties, decode_message
from shardbus.amqp.message import BodyType as WireBody
from shardbus.amqp.transport import AmqpClient
from shardbus.amqp.types import Array, Described, Int, Long, Symbol, Timestamp
from shardbus.endpoint import rules
from shardbus.endpoint.management import OPERATIONS, ManagementContext, ManagementReply
from shardbus.model.errors import ArgumentError, InvalidOperation
from shardbus.model.filters import (
    CorrelationFilter,
    EmptyRuleAction,
    FalseFilter,
    Rule,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
)

ADD, REMOVE, ENUMERATE = "com.microsoft:add-rule", "com.microsoft:remove-rule", "com.microsoft:enumerate-rules"


def call(broker, node: str, operation: str, body: dict[str, Any]) -> Reply:
    return management(broker.server.port, node, [(operation, body)])[0]


def add_body(rule: Rule) -> dict[str, Any]:
    """The add-rule body as the .NET client builds it."""
    return {"rule-name": rule.name, "rule-description": rules.encode_rule_map(rule)}


def drain(ns, path: str) -> list:
    got = []
    with ns.receiver(path, mode="receive_and_delete") as receiver:
        while batch := receiver.receive(max_count=50, max_wait=0.5):
            got.extend(batch)
    return got


def enumerate_all(broker, node: str) -> list[Rule]:
    reply = call(broker, node, ENUMERATE, {"top": 100, "skip": 0})
    if reply.status == 204:
        return []
    assert reply.status == 200, reply
    return [rules.decode_rule(entry["rule-description"]) for entry in reply.body["rules"]]


# --- codec ---------------------------------------------------------------------------------------------------
SAMPLE_RULES = [
    Rule(
        "sql",
        SqlFilter(
            "color = @c AND quantity > @q AND at < @when AND ttl < @span",
            {
                "@c": "red",
                "@q": 5,
                "@when": datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC),
                "@span": timedelta(seconds=90, microseconds=5),
                "@id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
                "@raw": b"\x00\x01",
                "@ratio": 0.25,
                "@flag": True,
            },
        ),
        SqlRuleAction("SET tier = @t; REMOVE scratch", {"@t": "gold"}),
    ),
    Rule(
        "corr",
        CorrelationFilter(
            correlation_id="c1",
            message_id="m1",
            to="to1",
            reply_to="rt1",
            subject="label1",
            session_id="s1",
            reply_to_session_id="rts1",
            content_type="application/json",
            properties={"kind": "alert", "level": 3, "at": datetime(2024, 1, 1, tzinfo=UTC)},
        ),
        SqlRuleAction("SET routed = true"),
    ),
    Rule("only-props", CorrelationFilter(properties={"kind": "audit"})),
    Rule("yes", TrueFilter()),
    Rule("no", FalseFilter(), SqlRuleAction("SET x = 1")),
    Rule("plain", SqlFilter("a = 1")),
]


@pytest.mark.parametrize("rule", SAMPLE_RULES, ids=lambda r: r.name)
def test_rule_descriptions_round_trip_exactly_through_the_wire(rule):
    described = codec.decode(codec.encode(rules.encode_rule(rule, 1_700_000_000.25)))
    assert rules.decode_rule(described) == rule
    assert codec.encode(rules.encode_rule(rules.decode_rule(described), 1_700_000_000.25)) == codec.encode(
        rules.encode_rule(rule, 1_700_000_000.25)
    )
    request_map = codec.decode(codec.encode(rules.encode_rule_map(rule)))
    assert rules.decode_rule(request_map) == rule
    assert rules.decode_rule(request_map, "renamed").name == "renamed"


def test_described_layout_is_the_services():
    sql = rules.encode_rule(SAMPLE_RULES[0], datetime(2024, 1, 1, tzinfo=UTC))
    assert sql.descriptor == 0x0000013700000004
    assert sql.value[0].descriptor == 0x000001370000006  # the filter codes are 0x00000013:7000000N
    assert sql.value[0].value[:2] == ["color = @c AND quantity > @q AND at < @when AND ttl < @span", 20]
    assert sql.value[0].value[2]["@when"] == Timestamp(1714979289123)
    assert sql.value[0].value[2]["@span"] == Described(Symbol("com.microsoft:timespan"), Long(900000050))
    assert sql.value[1].descriptor == 0x0000013700000006
    assert sql.value[1].value == ["SET tier = @t; REMOVE scratch", 20, {"@t": "gold"}]
    assert sql.value[2] == "sql"
    assert sql.value[3] == Timestamp(1704067200000)

    corr = rules.encode_rule(SAMPLE_RULES[1])
    assert corr.value[0].descriptor == 0x000001370000009
    assert corr.value[0].value[:8] == ["c1", "m1", "to1", "rt1", "label1", "s1", "rts1", "application/json"]
    assert corr.value[0].value[8]["kind"] == "alert"
    assert len(corr.value) == 3  # no created-at when unknown

    assert rules.encode_filter(TrueFilter()) == Described(0x000001370000007, [])
    assert rules.encode_filter(FalseFilter()) == Described(0x000001370000008, [])
    assert rules.encode_action(EmptyRuleAction()) == Described(0x0000013700000005, [])
    assert rules.encode_filter(SqlFilter("a = 1")).value == ["a = 1", Int(20)]  # no parameters, no third field


def test_the_sdk_decoder_reads_the_enumerate_layout():
    body = {"rules": [{"rule-description": rules.encode_rule(r, 1_700_000_000)} for r in SAMPLE_RULES[:2]]}
    message = AmqpMessage(
        properties=Properties(correlation_id=uuid.uuid4()),
        application_properties={"statusCode": 200, "statusDescription": "OK"},
        body=body,
        body_type=WireBody.VALUE,
    )
    decoded = decode_payload(memoryview(message.encode())).value
    sql, corr = (entry[b"rule-description"] for entry in decoded[b"rules"])
    # the layout the uamqp-era azure-servicebus build_rule_description read: [filter, action, name, created ms]
    assert sql[0][:2] == [b"color = @c AND quantity > @q AND at < @when AND ttl < @span", 20]
    assert sql[1][0] == b"SET tier = @t; REMOVE scratch" and sql[2] == b"sql" and sql[3] == 1_700_000_000_000
    assert len(corr[0]) == 9 and corr[0][4] == b"label1" and corr[0][8][b"kind"] == b"alert"


def test_decoding_is_lenient_where_clients_differ():
    # Java puts every correlation key with nulls and a null action; Rust sends {} for "no action"
    java = {
        "correlation-filter": {
            "correlation-id": None,
            "message-id": None,
            "to": None,
            "reply-to": None,
            "label": "red",
            "session-id": None,
            "reply-to-session-id": None,
            "content-type": None,
            "properties": {},
        },
        "sql-rule-action": None,
        "rule-name": "j",
    }
    assert rules.decode_rule(java) == Rule("j", CorrelationFilter(subject="red"))
    rust = {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {}}
    assert rules.decode_rule(rust, "r") == Rule("r", TrueFilter())
    rust_action = {
        "sql-filter": {"expression": "a = 1"},
        "sql-rule-action": {"expression": Described(0x0000013700000006, ["SET b = 2"])},
    }
    assert rules.decode_rule(rust_action, "r").action == SqlRuleAction("SET b = 2")
    # descriptor names and the 0x00000137:0000000N spelling of filter codes are accepted too
    named = Described(Symbol("com.microsoft:sql-filter:list"), ["a = 1", 20])
    assert rules.decode_filter(named) == SqlFilter("a = 1")
    assert rules.decode_filter(Described(0x0000013700000009, [None, None, "to"])) == CorrelationFilter(to="to")
    # .NET types for properties: DateTimeOffset and Uri are described values
    offset = Described(Symbol("com.microsoft:datetime-offset"), Long(638_000_000_000_000_000))
    uri = Described(Symbol("com.microsoft:uri"), "http://x/")
    f = rules.decode_filter(Described(0x000001370000009, [None] * 8 + [{"o": offset, "u": uri}]))
    assert f.properties == {"o": datetime(2022, 9, 28, 22, 13, 20, tzinfo=UTC), "u": "http://x/"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Described(0x000001370000099, []), "Unknown rule filter type"),
        (Described(Symbol("com.microsoft:regex-filter:list"), []), "Unknown rule filter type"),
        ("a = 1", "must be a described list"),
        (Described(0x000001370000006, [None, 20]), "SQL filter expression must be a string"),
        (Described(0x000001370000009, [None] * 8 + [{"bad": [1, 2]}]), "unsupported AMQP type"),
        (Described(0x000001370000009, [None] * 8 + [{"bad": Array(int, [1])}]), "unsupported AMQP type"),
        (Described(0x000001370000009, [None] * 8 + [{}]), "at least one"),
        (Described(0x000001370000006, ["a = = 1", 20]), "Invalid SQL filter expression"),
    ],
)
def test_bad_filters_are_argument_errors(value, message):
    with pytest.raises(ArgumentError, match=message):
        rules.decode_filter(value)


def test_bad_rule_descriptions_are_argument_errors():
    with pytest.raises(ArgumentError, match="Unknown rule filter type 'regex-filter'"):
        rules.decode_rule({"regex-filter": {"pattern": ".*"}}, "r")
    with pytest.raises(ArgumentError, match="not both"):
        rules.decode_rule({"sql-filter": {"expression": "a=1"}, "correlation-filter": {"to": "x"}}, "r")
    with pytest.raises(ArgumentError, match="exactly one"):
        rules.decode_rule({"sql-rule-action": None}, "r")
    with pytest.raises(ArgumentError, match="Unknown rule action type"):
        rules.decode_action(Described(0x0000013700000099, []))
    with pytest.raises(ArgumentError, match="rule-description:list"):
        rules.decode_rule(Described(0x0000013700000099, []))
    with pytest.raises(ArgumentError, match="must be a map"):
        rules.decode_rule("sql", "r")


# --- over the wire -------------------------------------------------------------------------------------------
def test_add_rules_changes_routing(broker, ns, topic, conn_str):
    t = topic(subscriptions=("reds", "alerts", "none", "all"))
    sub = {s: f"{t}/Subscriptions/{s}" for s in ("reds", "alerts", "none", "all")}
    for path in sub.values():
        assert call(broker, path, REMOVE, {"rule-name": "$Default"}).status == 200

    sql = Rule("big-reds", SqlFilter("color = @c AND quantity >= @q", {"@c": "red", "@q": 5}))
    tagged = Rule("tag-reds", SqlFilter("color = 'red'"), SqlRuleAction("SET tier = @t", {"@t": "gold"}))
    replies = management(broker.server.port, sub["reds"], [(ADD, add_body(sql)), (ADD, add_body(tagged))])
    assert [(r.status, r.condition, r.body) for r in replies] == [(200, None, None), (200, None, None)]
    corr = Rule("alerts", CorrelationFilter(subject="alert", properties={"region": "eu", "level": 3}))
    assert call(broker, sub["alerts"], ADD, add_body(corr)).status == 200
    assert call(broker, sub["none"], ADD, add_body(Rule("never", FalseFilter()))).status == 200
    assert call(broker, sub["all"], ADD, add_body(Rule("always", TrueFilter()))).status == 200

    assert ns.list_rules(t, "reds") == [sql, tagged]
    assert ns.list_rules(t, "alerts") == [corr]
    assert ns.list_rules(t, "none") == [Rule("never", FalseFilter())]
    assert ns.list_rules(t, "all") == [Rule("always", TrueFilter())]
    assert enumerate_all(broker, sub["reds"]) == [sql, tagged]  # parameters survive the round trip

    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_topic_sender(t) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("big red", application_properties={"color": "red", "quantity": 7}),
                ServiceBusMessage("small red", application_properties={"color": "red", "quantity": 1}),
                ServiceBusMessage("blue", application_properties={"color": "blue", "quantity": 9}),
                ServiceBusMessage("eu alert", subject="alert", application_properties={"region": "eu", "level": 3}),
                ServiceBusMessage("us alert", subject="alert", application_properties={"region": "us", "level": 3}),
            ]
        )

    reds = drain(ns, sub["reds"])
    plain = sorted(m.body for m in reds if "RuleName" not in (m.application_properties or {}))
    actioned = {m.body: m.application_properties for m in reds if "RuleName" in (m.application_properties or {})}
    assert plain == [b"big red"]
    assert set(actioned) == {b"big red", b"small red"}
    assert all(p["tier"] == "gold" and p["RuleName"] == "tag-reds" for p in actioned.values())
    assert [m.body for m in drain(ns, sub["alerts"])] == [b"eu alert"]
    assert drain(ns, sub["none"]) == []
    assert len(drain(ns, sub["all"])) == 5

    # removing the rule stops the routing it did
    assert call(broker, sub["alerts"], REMOVE, {"rule-name": "ALERTS"}).status == 200  # names are case-insensitive
    assert ns.list_rules(t, "alerts") == []
    ns.send(t, [ns_message("eu alert again", subject="alert", region="eu", level=3)])
    assert drain(ns, sub["alerts"]) == []
    assert len(drain(ns, sub["all"])) == 1


def ns_message(body: str, subject: str | None = None, **props: Any):
    from shardbus import Message

    return Message(body, subject=subject, application_properties=props)


def test_enumerate_pages_with_skip_and_top(broker, ns, topic):
    t = topic()
    node = f"{t}/Subscriptions/s1"
    before = datetime.now(UTC) - timedelta(seconds=5)
    added = [Rule(f"r{i}", SqlFilter(f"n = {i}")) for i in range(5)]
    replies = management(broker.server.port, node, [(ADD, add_body(r)) for r in added])
    assert all(r.status == 200 for r in replies)
    expected = [Rule("$Default", TrueFilter()), *added]

    pages = management(
        broker.server.port,
        node,
        [(ENUMERATE, {"top": 2, "skip": skip}) for skip in (0, 2, 4, 6)] + [(ENUMERATE, {"top": 100, "skip": 0})],
    )
    assert [p.status for p in pages] == [200, 200, 200, 204, 200]
    assert pages[3].body is None and pages[3].description == "No Content"
    got = [rules.decode_rule(e["rule-description"]) for p in pages[:3] for e in p.body["rules"]]
    assert got == expected
    assert [rules.decode_rule(e["rule-description"]) for e in pages[4].body["rules"]] == expected

    entry = pages[0].body["rules"][0]
    assert isinstance(pages[0].body["rules"], list) and not isinstance(pages[0].body["rules"], Array)
    description = entry["rule-description"]
    assert description.descriptor == 0x0000013700000004
    assert description.value[0] == Described(0x000001370000007, [])  # $Default: the true filter
    assert description.value[1] == Described(0x0000013700000005, [])
    assert description.value[2] == "$Default"
    created = datetime.fromtimestamp(description.value[3] / 1000, UTC)
    assert isinstance(description.value[3], Timestamp) and before < created < datetime.now(UTC) + timedelta(1)

    # without 'top' everything after 'skip'
    rest = call(broker, node, ENUMERATE, {"skip": 3})
    assert [rules.decode_rule(e["rule-description"]).name for e in rest.body["rules"]] == ["r2", "r3", "r4"]


def test_the_node_is_matched_case_insensitively(broker, ns, topic):
    t = topic(subscriptions=("Orders",))
    node = f"{t.upper()}/subscriptions/ORDERS"
    assert call(broker, node, ADD, add_body(Rule("x", SqlFilter("a = 1")))).status == 200
    assert [r.name for r in ns.list_rules(t, "Orders")] == ["$Default", "x"]
    assert [r.name for r in enumerate_all(broker, node)] == ["$Default", "x"]


def test_errors_are_the_services(broker, ns, topic, queue):
    t = topic()
    node = f"{t}/Subscriptions/s1"
    good = add_body(Rule("r1", SqlFilter("a = 1")))
    cases: list[tuple[str, dict[str, Any]]] = [
        (ADD, good),
        (ADD, {**good, "rule-name": "R1"}),  # same name, other case
        (ADD, add_body(Rule("bad-sql", SqlFilter("a = 1")))),
        (ADD, {"rule-name": "r2", "rule-description": {"regex-filter": {"pattern": "x"}}}),
        (ADD, {"rule-name": "r2", "rule-description": {"sql-filter": {"expression": "a=1"}, "correlation-filter": {}}}),
        (ADD, {"rule-description": {"sql-filter": {"expression": "a=1"}}}),
        (ADD, {"rule-name": "r2"}),
        (ADD, add_body(Rule("bad name!", SqlFilter("a = 1")))),
        (ADD, {"rule-name": "r2", "rule-description": {"correlation-filter": {"properties": {}}}}),
        (REMOVE, {"rule-name": "missing"}),
        (REMOVE, {}),
        (ENUMERATE, {"top": 10, "skip": -1}),
        (ENUMERATE, {"top": "ten"}),
    ]
    cases[2][1]["rule-description"]["sql-filter"]["expression"] = "a = = 1"
    got = [(r.status, r.condition) for r in management(broker.server.port, node, cases)]
    assert got == [
        (200, None),
        (409, "com.microsoft:entity-already-exists"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-error"),
        (404, "amqp:not-found"),
        (400, "com.microsoft:argument-error"),
        (400, "com.microsoft:argument-out-of-range"),
        (400, "com.microsoft:argument-error"),
    ]
    assert [r.name for r in ns.list_rules(t, "s1")] == ["$Default", "r1"]

    replies = management(broker.server.port, node, [(REMOVE, {"rule-name": "missing"}), (ADD, good)])
    assert "missing" in replies[0].description and "r1" in replies[1].description
    assert isinstance(replies[0].condition, Symbol)

    # rules live only on a subscription's node
    q = queue()
    for other in (q, t, f"{node}/$DeadLetterQueue"):
        for operation, body in ((ADD, good), (REMOVE, {"rule-name": "r1"}), (ENUMERATE, {"top": 1})):
            reply = call(broker, other, operation, body)
            assert (reply.status, reply.condition) == (400, "amqp:not-allowed"), (other, operation, reply)
            assert "Subscriptions" in reply.description


def test_removing_every_rule_leaves_an_empty_listing(broker, ns, topic):
    t = topic()
    node = f"{t}/Subscriptions/s1"
    replies = management(
        broker.server.port, node, [(REMOVE, {"rule-name": "$Default"}), (ENUMERATE, {"top": 100, "skip": 0})]
    )
    assert [(r.status, r.body) for r in replies] == [(200, None), (204, None)]


def test_the_subscription_vanishing_between_requests_is_not_found(broker, ns, topic):
    t = topic()
    node = f"{t}/Subscriptions/s1"

    async def run() -> Reply:
        client = await AmqpClient.connect(
            "127.0.0.1",
            broker.server.port,
            timeout=10,
            sasl_mechanism="PLAIN",
            username="RootManageSharedAccessKey",
            password="SAS_KEY_VALUE",
        )
        try:
            session = await client.session()
            receiver = await session.receiver(f"{node}/$management", credit=10)
            sender = await session.sender(f"{node}/$management")
            ns.delete_subscription(t, "s1")
            request = AmqpMessage(
                properties=Properties(message_id=uuid.uuid4(), reply_to=f"{node}/$management"),
                application_properties={"operation": ENUMERATE},
                body={"top": 10},
                body_type=WireBody.VALUE,
            )
            await sender.send(request.encode())
            return Reply(decode_message((await receiver.receive(timeout=10)).payload))
        finally:
            await client.close()

    reply = asyncio.run(run())
    assert (reply.status, reply.condition) == (404, "amqp:not-found")


# --- transactions (handlers called directly: the connection sets ManagementContext.transaction_id) --------
def _context(ns, node: str, transaction_id: bytes | None) -> ManagementContext:
    ctx = ManagementContext(ns, node, lambda *a: None, lambda *a: None, {})  # type: ignore[arg-type]
    ctx.transaction_id = transaction_id  # type: ignore[attr-defined]
    return ctx


def test_rule_changes_are_refused_inside_a_transaction(ns, topic):
    t = topic()
    node = f"{t}/Subscriptions/s1"
    txn = b"\x00\x00\x00\x01"
    body = add_body(Rule("in-txn", SqlFilter("a = 1")))
    for operation, request, verb, name in (
        (ADD, body, "added", "in-txn"),
        (REMOVE, {"rule-name": "$Default"}, "removed", "$Default"),
    ):
        with pytest.raises(InvalidOperation) as raised:
            OPERATIONS[operation](_context(ns, node, txn), request)
        assert f"'{name}' cannot be {verb} within a transaction" in str(raised.value)
        reply = ManagementReply.error(raised.value)
        assert (reply.status, reply.condition) == (400, "amqp:not-allowed")
    assert [r.name for r in ns.list_rules(t, "s1")] == ["$Default"]

    # outside a transaction the same requests work, and enumerating inside one is allowed
    assert OPERATIONS[ADD](_context(ns, node, None), body).status == 200
    listing = OPERATIONS[ENUMERATE](_context(ns, node, txn), {"top": 10})
    assert [rules.decode_rule(e["rule-description"]).name for e in listing.body["rules"]] == ["$Default", "in-txn"]
