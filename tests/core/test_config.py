"""The emulator's Config.json importer: format, shardbus extensions, apply/re-apply, and errors with their path.

``data/emulator_config.json`` is the sample Microsoft documents for the Azure Service Bus emulator ("Test locally
by using the Azure Service Bus emulator", the config.json of the Docker steps; the installer repository's
``ServiceBus-Emulator/Config/Config.json`` has the same shape), kept as the emulator ships it.
"""

from __future__ import annotations

import copy
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import shardbus
from shardbus import CorrelationFilter, Message, Rule, SqlFilter, SqlRuleAction, TrueFilter
from shardbus.config import (
    ConfigError,
    NamespaceConfig,
    apply_config,
    load_config,
    open_namespace,
    parse_duration,
    read_config,
)
from shardbus.model.entities import TIMESPAN_MAX, EntityStatus

SAMPLE = Path(__file__).parent / "data" / "emulator_config.json"
NS0 = "UserConfig.Namespaces[0]"


def sample() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text())


def config(*namespaces: dict[str, Any], logging_type: str = "Console") -> dict[str, Any]:
    return {"UserConfig": {"Namespaces": list(namespaces), "Logging": {"Type": logging_type}}}


def namespace(name: str = "sbemulatorns", **extra: Any) -> dict[str, Any]:
    return {"Name": name, "Queues": [], "Topics": [], **extra}


def one(data: dict[str, Any]) -> NamespaceConfig:
    [ns] = load_config(data)
    return ns


def receive_all(ns: shardbus.Namespace, path: str) -> list[Message]:
    with ns.receiver(path, mode="receive_and_delete") as receiver:
        return receiver.receive(max_count=100, max_wait=0.5)


# ---------------------------------------------------------------------------------------------------------
# The emulator's own sample
# ---------------------------------------------------------------------------------------------------------


def test_emulator_sample_is_read_as_documented() -> None:
    cfg = read_config(SAMPLE)
    assert cfg.logging == ("File",)
    [ns] = cfg.namespaces
    assert (ns.name, ns.tier, ns.premium_partitions) == ("sbemulatorns", None, None)
    [queue] = ns.queues
    q = queue.description
    assert q.name == "queue.1"
    assert q.lock_duration == timedelta(minutes=1)
    assert q.default_message_time_to_live == timedelta(hours=1)
    assert q.duplicate_detection_history_time_window == timedelta(seconds=20)
    assert q.max_delivery_count == 3
    assert q.forward_to is None and q.forward_dead_lettered_messages_to is None  # "" means no forwarding
    assert not (q.requires_session or q.requires_duplicate_detection or q.dead_lettering_on_message_expiration)
    [topic] = ns.topics
    assert topic.description.name == "topic.1"
    assert topic.description.default_message_time_to_live == timedelta(hours=1)
    subs = {s.description.name: s for s in topic.subscriptions}
    assert list(subs) == ["subscription.1", "subscription.2", "subscription.3", "subscription.4"]
    assert subs["subscription.1"].rules == [
        Rule(
            "app-prop-filter-1",
            CorrelationFilter(
                content_type="application/text",
                correlation_id="id1",
                subject="subject1",  # the emulator's "Label"
                message_id="msgid1",
                reply_to="someQueue",
                reply_to_session_id="sessionId",
                session_id="session1",
                to="xyz",
            ),
        )
    ]
    assert subs["subscription.2"].rules == [
        Rule("user-prop-filter-1", CorrelationFilter(properties={"prop1": "value1"}))
    ]
    assert subs["subscription.3"].rules == []
    assert subs["subscription.4"].rules == [
        Rule(
            "sql-filter-1",
            SqlFilter("sys.MessageId = '123456' AND userProp1 = 'value1'"),
            SqlRuleAction("SET sys.To = 'Entity'"),
        )
    ]


def test_emulator_sample_applies_and_routes(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(sample()))
    assert [q.name for q in ns.list_queues()] == ["queue.1"]
    assert ns.get_queue("queue.1").max_delivery_count == 3
    sub1 = ns.get_subscription("topic.1", "subscription.1")
    assert (sub1.lock_duration, sub1.max_delivery_count) == (timedelta(minutes=1), 3)
    assert [r.name for r in ns.list_rules("topic.1", "subscription.1")] == ["app-prop-filter-1"]
    assert ns.list_rules("topic.1", "subscription.3") == [Rule("$Default", TrueFilter())]  # no Rules: $Default

    ns.send("topic.1", Message(b"x", message_id="123456", application_properties={"userProp1": "value1"}))
    ns.send("topic.1", Message(b"y", application_properties={"prop1": "value1"}))
    assert receive_all(ns, "topic.1/Subscriptions/subscription.1") == []
    assert [m.body for m in receive_all(ns, "topic.1/Subscriptions/subscription.2")] == [b"y"]
    assert sorted(m.body for m in receive_all(ns, "topic.1/Subscriptions/subscription.3")) == [b"x", b"y"]
    [copy4] = receive_all(ns, "topic.1/Subscriptions/subscription.4")
    assert (copy4.body, copy4.to) == (b"x", "Entity")  # the rule's action ran


def test_sample_survives_a_restart_and_re_applies_as_a_no_op(tmp_path) -> None:
    cfg = one(sample())
    with open_namespace(tmp_path, cfg) as ns:
        stamps = {q.name: ns.created_updated(q.name) for q in ns.list_queues()}
    with open_namespace(tmp_path, cfg) as ns:
        assert {q.name: ns.created_updated(q.name) for q in ns.list_queues()} == stamps
        assert len(ns.list_subscriptions("topic.1")) == 4


def test_file_with_bom_and_the_installers_queue_only_variant(tmp_path) -> None:
    # The installer's other samples omit "Topics" entirely; .NET tools often write a UTF-8 BOM.
    data = config(
        {"Name": "sbemulatorns", "Queues": [{"Name": "background-task", "Properties": {"MaxDeliveryCount": 3}}]}
    )
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(data), encoding="utf-8-sig")
    [ns] = load_config(path)
    assert [q.description.name for q in ns.queues] == ["background-task"] and ns.topics == []


def test_exporter_style_nulls_mean_not_set() -> None:
    # Go exporters write null for unset pointers and for empty slices.
    data = config(
        {
            "Name": "sbemulatorns",
            "Queues": None,
            "Topics": [
                {
                    "Name": "t",
                    "Properties": {"DefaultMessageTimeToLive": None, "RequiresDuplicateDetection": None},
                    "Subscriptions": [
                        {
                            "Name": "s",
                            "Properties": {"LockDuration": "PT30S", "ForwardTo": None},
                            "Rules": [
                                {
                                    "Name": "r",
                                    "Properties": {
                                        "FilterType": "Correlation",
                                        "CorrelationFilter": {"Label": "a", "ReplyTo": None},
                                        "SqlFilter": None,
                                        "Action": {},
                                    },
                                }
                            ],
                        }
                    ],
                }
            ],
        }
    )
    ns = one(data)
    [topic] = ns.topics
    assert topic.settings == {}
    assert topic.description.default_message_time_to_live == TIMESPAN_MAX
    [sub] = topic.subscriptions
    assert set(sub.settings) == {"lock_duration"}
    assert sub.rules == [Rule("r", CorrelationFilter(subject="a"))]


def test_property_names_are_case_insensitive_like_net_configuration() -> None:
    data = config(
        {"name": "sbemulatorns", "queues": [{"NAME": "q", "properties": {"lockDuration": "PT30S"}}], "Topics": []}
    )
    assert one(data).queues[0].description.lock_duration == timedelta(seconds=30)


# ---------------------------------------------------------------------------------------------------------
# Extensions and beyond-the-emulator limits
# ---------------------------------------------------------------------------------------------------------


def test_every_entity_extension(open_ns) -> None:
    data = config(
        namespace(
            Sku="Standard",
            Queues=[
                {
                    "Name": "orders",
                    "Properties": {
                        "EnablePartitioning": True,
                        "MaxSizeInMegabytes": 2048,
                        "Status": "SendDisabled",
                        "AutoDeleteOnIdle": "P7D",
                        "UserMetadata": "owned by billing",
                        "DefaultMessageTimeToLive": "P10675199DT2H48M5.4775807S",
                        "LockDuration": "00:02:00",
                        "EnableBatchedOperations": False,
                    },
                }
            ],
            Topics=[
                {
                    "Name": "events",
                    "Properties": {
                        "EnablePartitioning": True,
                        "MaxSizeInMegabytes": 5120,
                        "Status": "Active",
                        "UserMetadata": "fan-out",
                        "SupportOrdering": False,
                        "DefaultMessageTimeToLive": "P14D",  # beyond the emulator's 1 h cap
                    },
                    "Subscriptions": [
                        {
                            "Name": "audit",
                            "Properties": {
                                "Status": "ReceiveDisabled",
                                "AutoDeleteOnIdle": "1.00:00:00",
                                "UserMetadata": "audit trail",
                                "DeadLetteringOnFilterEvaluationExceptions": False,
                            },
                        }
                    ],
                }
            ],
        )
    )
    ns = open_ns(name="sbemulatorns", tier="standard")
    apply_config(ns, one(data))
    q = ns.get_queue("orders")
    assert q.enable_partitioning and len(ns._queue("orders").partitions) == 16
    assert (q.max_size_in_megabytes, q.status, q.user_metadata) == (
        2048,
        EntityStatus.SEND_DISABLED,
        "owned by billing",
    )
    assert q.auto_delete_on_idle == timedelta(days=7)
    assert q.default_message_time_to_live == TIMESPAN_MAX
    assert q.lock_duration == timedelta(minutes=2)
    assert q.enable_batched_operations is False
    t = ns.get_topic("events")
    assert t.enable_partitioning and len(ns._topic("events").partitions) == 16
    assert (t.max_size_in_megabytes, t.user_metadata, t.support_ordering) == (5120, "fan-out", False)
    assert t.default_message_time_to_live == timedelta(days=14)
    s = ns.get_subscription("events", "audit")
    assert (s.status, s.auto_delete_on_idle, s.user_metadata) == (
        EntityStatus.RECEIVE_DISABLED,
        timedelta(days=1),
        "audit trail",
    )
    assert s.dead_lettering_on_filter_evaluation_exceptions is False


def test_premium_sku_and_partitions_open_the_namespace_that_way(tmp_path) -> None:
    data = config(
        namespace(
            "prem",
            Sku="Premium",
            PremiumMessagingPartitions=2,
            Queues=[{"Name": "big", "Properties": {"MaxSizeInMegabytes": 40960}}],
        )
    )
    cfg = one(data)
    assert (cfg.tier, cfg.premium_partitions) == (shardbus.Tier.PREMIUM, 2)
    with open_namespace(tmp_path, cfg) as ns:
        assert ns.tier.tier is shardbus.Tier.PREMIUM and ns.tier.premium_partitions == 2
        assert len(ns._queue("big").partitions) == 2
        assert ns.get_queue("big").max_size_in_megabytes == 40960


def test_premium_ignores_enable_partitioning_false_on_re_apply(open_ns) -> None:
    data = config(
        namespace(
            Sku="Premium",
            PremiumMessagingPartitions=4,
            Queues=[{"Name": "q", "Properties": {"EnablePartitioning": False}}],
        )
    )
    ns = open_ns(name="sbemulatorns", tier="premium", premium_partitions=4)
    apply_config(ns, one(data))
    apply_config(ns, one(data))  # stored as partitioned (premium partitions everything): not an immutable change
    assert ns.get_queue("q").enable_partitioning is True


def test_basic_sku(open_ns) -> None:
    data = config(namespace("cheap", Sku="basic", Queues=[{"Name": "q"}]))
    ns = open_ns(name="cheap", tier="basic")
    apply_config(ns, one(data))
    assert [q.name for q in ns.list_queues()] == ["q"]


def test_several_namespaces_and_many_entities(tmp_path) -> None:
    many = [{"Name": f"q{i}", "Properties": {"MaxDeliveryCount": 20}} for i in range(60)]  # emulator caps at 50
    data = config(
        namespace("first", Queues=many),
        namespace("second", Sku="Premium", Topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}]}]),
    )
    first, second = load_config(data)
    with open_namespace(tmp_path, first) as ns1, open_namespace(tmp_path, second) as ns2:
        assert len(ns1.list_queues()) == 60 and ns1.get_queue("q59").max_delivery_count == 20
        assert ns1.list_topics() == []
        assert ns2.tier.tier is shardbus.Tier.PREMIUM
        assert [s.name for s in ns2.list_subscriptions("t")] == ["s"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "second"]


def test_forwarding_to_entities_defined_later_in_the_config(open_ns) -> None:
    data = config(
        namespace(
            Queues=[
                {"Name": "inbox", "Properties": {"ForwardTo": "work", "ForwardDeadLetteredMessagesTo": "graveyard"}},
                {"Name": "work"},
                {"Name": "graveyard"},
            ],
            Topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": {"ForwardTo": "inbox"}}]}],
        )
    )
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(data))
    inbox = ns.get_queue("inbox")
    assert (inbox.forward_to, inbox.forward_dead_lettered_messages_to) == ("work", "graveyard")
    assert ns.get_subscription("t", "s").forward_to == "inbox"
    apply_config(ns, one(data))  # idempotent, forwarding included


# ---------------------------------------------------------------------------------------------------------
# Re-applying: idempotence, updates, rules
# ---------------------------------------------------------------------------------------------------------


def test_applying_twice_changes_nothing(open_ns, caplog) -> None:
    ns = open_ns(name="sbemulatorns")
    cfg = one(sample())
    apply_config(ns, cfg)
    paths = ["queue.1", "topic.1", *(f"topic.1/Subscriptions/subscription.{i}" for i in range(1, 5))]
    stamps = {p: ns.created_updated(p) for p in paths}
    rules = {i: ns.list_rules("topic.1", f"subscription.{i}") for i in range(1, 5)}
    with caplog.at_level(logging.INFO, logger="shardbus.config"):
        apply_config(ns, one(sample()))
    assert [r.message for r in caplog.records if r.name == "shardbus.config"] == []
    assert {p: ns.created_updated(p) for p in paths} == stamps
    assert {i: ns.list_rules("topic.1", f"subscription.{i}") for i in range(1, 5)} == rules


def test_changed_properties_are_updated_and_unmentioned_ones_kept(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(sample()))
    ns.update_queue("queue.1", user_metadata="set by the application")
    data = sample()
    q = data["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]
    q["LockDuration"] = "PT2M"
    q["MaxDeliveryCount"] = 7
    data["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][2]["Properties"]["LockDuration"] = "PT30S"
    apply_config(ns, one(data))
    queue = ns.get_queue("queue.1")
    assert (queue.lock_duration, queue.max_delivery_count) == (timedelta(minutes=2), 7)
    assert queue.user_metadata == "set by the application"  # the config does not mention it
    assert ns.get_subscription("topic.1", "subscription.3").lock_duration == timedelta(seconds=30)


def test_listed_rules_replace_default_and_become_exact(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    ns.create_topic("topic.1")
    ns.create_subscription("topic.1", "subscription.1")  # with $Default
    ns.create_subscription("topic.1", "subscription.3")
    ns.create_rule("topic.1", "subscription.3", Rule("mine", SqlFilter("a = 1")))
    apply_config(ns, one(sample()))
    assert [r.name for r in ns.list_rules("topic.1", "subscription.1")] == ["app-prop-filter-1"]
    # subscription.3 lists no rules: whatever it has is left alone
    assert [r.name for r in ns.list_rules("topic.1", "subscription.3")] == ["$Default", "mine"]

    data = sample()
    sub4 = data["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][3]
    sub4["Rules"][0]["Properties"]["SqlFilter"]["SqlExpression"] = "userProp1 = 'value2'"
    sub4["Rules"].append(
        {"Name": "everything", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1 = 1"}}}
    )
    apply_config(ns, one(data))
    assert ns.list_rules("topic.1", "subscription.4") == [
        Rule("everything", TrueFilter()),
        Rule("sql-filter-1", SqlFilter("userProp1 = 'value2'"), SqlRuleAction("SET sys.To = 'Entity'")),
    ]
    apply_config(ns, one(data))
    assert len(ns.list_rules("topic.1", "subscription.4")) == 2


def test_new_subscription_with_rules_never_has_default(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(sample()))
    assert all(r.name != "$Default" for r in ns.list_rules("topic.1", "subscription.4"))


def test_entities_not_in_the_config_are_kept(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    ns.create_queue("mine")
    apply_config(ns, one(sample()))
    assert sorted(q.name for q in ns.list_queues()) == ["mine", "queue.1"]


# ---------------------------------------------------------------------------------------------------------
# Errors, each with the path of the offending value
# ---------------------------------------------------------------------------------------------------------

Q0 = f"{NS0}.Queues[0]"
T0 = f"{NS0}.Topics[0]"
S0 = f"{T0}.Subscriptions[0]"
R0 = f"{S0}.Rules[0]"


def _sql_rule(expression: str, action: str | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {"FilterType": "Sql", "SqlFilter": {"SqlExpression": expression}}
    if action is not None:
        props["Action"] = {"SqlExpression": action}
    return {"Name": "r", "Properties": props}


def _queue(**props: Any) -> dict[str, Any]:
    return config(namespace(Queues=[{"Name": "q", "Properties": props}]))


def _topic(props: dict[str, Any] | None = None, sub: dict[str, Any] | None = None, **ns: Any) -> dict[str, Any]:
    topic: dict[str, Any] = {"Name": "t", "Properties": props or {}}
    if sub is not None:
        topic["Subscriptions"] = [sub]
    return config(namespace(Topics=[topic], **ns))


ERROR_CASES = [
    pytest.param(
        _queue(LockDurration="PT1M"),
        f"{Q0}.Properties.LockDurration: unknown property of queue Properties; did you mean 'LockDuration'?",
        id="typo",
    ),
    pytest.param(
        _topic({"RequiresSession": True}),
        f"{T0}.Properties.RequiresSession: unknown property of topic Properties",
        id="not-a-topic-property",
    ),
    pytest.param(
        _queue(MaxDeliveryCount="3"), f"{Q0}.Properties.MaxDeliveryCount: expected a whole number", id="type-int"
    ),
    pytest.param(
        _queue(RequiresSession="true"), f"{Q0}.Properties.RequiresSession: expected true or false", id="type-bool"
    ),
    pytest.param(
        _queue(LockDuration=60), f"{Q0}.Properties.LockDuration: a duration must be a string", id="type-duration"
    ),
    pytest.param(
        _queue(LockDuration="10 minutes"),
        f"{Q0}.Properties.LockDuration: '10 minutes' is not a duration",
        id="bad-duration",
    ),
    pytest.param(
        _queue(DefaultMessageTimeToLive="P10675200D"),
        f"{Q0}.Properties.DefaultMessageTimeToLive: 'P10675200D' is longer than TimeSpan.MaxValue",
        id="duration-overflow",
    ),
    pytest.param(
        _queue(LockDuration="PT10M"),
        f"{Q0}.Properties.LockDuration: 'PT10M' is out of range: it must be between 0:00:05 and 0:05:00",
        id="out-of-range",
    ),
    pytest.param(
        _queue(DuplicateDetectionHistoryTimeWindow="PT5S"),
        f"{Q0}.Properties.DuplicateDetectionHistoryTimeWindow: 'PT5S' is out of range",
        id="out-of-range-core-not-emulator",
    ),
    pytest.param(_queue(MaxDeliveryCount=0), f"{Q0}.Properties.MaxDeliveryCount: 0 is not allowed", id="max-delivery"),
    pytest.param(
        _queue(MaxSizeInMegabytes=2000), f"{Q0}.Properties.MaxSizeInMegabytes: 2000 is invalid", id="max-size"
    ),
    pytest.param(_queue(Status="Paused"), f"{Q0}.Properties.Status: 'Paused' is not a status", id="status"),
    pytest.param(_queue(UserMetadata="x" * 1025), f"{Q0}.Properties.UserMetadata: ", id="user-metadata"),
    pytest.param(
        _queue(ForwardTo="q"), f"{Q0}.Properties.ForwardTo: 'q': an entity cannot forward to itself", id="self-forward"
    ),
    pytest.param(
        _queue(ForwardTo="-bad"), f"{Q0}.Properties.ForwardTo: '-bad' is not a queue or topic name", id="forward-name"
    ),
    pytest.param(
        config(namespace(Queues=[{"Name": "bad name!"}])),
        f"{Q0}.Name: The queue name 'bad name!' is invalid",
        id="queue-name",
    ),
    pytest.param(config(namespace(Queues=[{"Properties": {}}])), f"{Q0}: 'Name' is required", id="missing-name"),
    pytest.param(
        _topic(sub={"Name": "a/b"}), f"{S0}.Name: The subscription name 'a/b' is invalid", id="subscription-name"
    ),
    pytest.param(
        config(namespace(Queues=[{"Name": "Orders"}, {"Name": "orders"}])),
        f"{NS0}.Queues[1].Name: queue name 'orders' is already used at {Q0}",
        id="duplicate-queue",
    ),
    pytest.param(
        config(namespace(Queues=[{"Name": "x"}], Topics=[{"Name": "X"}])),
        f"{T0}.Name: topic name 'X' is already used at {Q0}",
        id="queue-and-topic-share-names",
    ),
    pytest.param(
        config(namespace(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}, {"Name": "S"}]}])),
        f"{T0}.Subscriptions[1].Name: subscription 'S' is already defined at {S0}",
        id="duplicate-subscription",
    ),
    pytest.param(
        _topic(sub={"Name": "s", "Rules": [_sql_rule("a = 1"), _sql_rule("a = 2")]}),
        f"{S0}.Rules[1].Name: rule 'r' is already defined at {R0}",
        id="duplicate-rule",
    ),
    pytest.param(
        config(namespace("dup"), namespace("DUP")),
        "UserConfig.Namespaces[1].Name: namespace 'DUP' is already defined at UserConfig.Namespaces[0]",
        id="duplicate-namespace",
    ),
    pytest.param(
        _topic(sub={"Name": "s", "Rules": [_sql_rule("sys.MessageId = ")]}),
        f"{R0}.Properties.SqlFilter.SqlExpression: 'sys.MessageId = ' is not a valid SQL filter",
        id="sql-filter",
    ),
    pytest.param(
        _topic(sub={"Name": "s", "Rules": [_sql_rule("a = 1", "SET x")]}),
        f"{R0}.Properties.Action.SqlExpression: 'SET x' is not a valid SQL rule action",
        id="sql-action",
    ),
    pytest.param(
        _topic(sub={"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Regex"}}]}),
        f"{R0}.Properties.FilterType: 'Regex' is not a filter type",
        id="filter-type",
    ),
    pytest.param(
        _topic(sub={"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Correlation"}}]}),
        f"{R0}.Properties: FilterType is 'Correlation', so 'CorrelationFilter' is required",
        id="missing-filter",
    ),
    pytest.param(
        _topic(
            sub={
                "Name": "s",
                "Rules": [{"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {}}}],
            }
        ),
        f"{R0}.Properties.CorrelationFilter: A correlation filter needs at least one",
        id="empty-correlation",
    ),
    pytest.param(
        _topic(
            sub={
                "Name": "s",
                "Rules": [
                    {
                        "Name": "r",
                        "Properties": {
                            "FilterType": "Correlation",
                            "CorrelationFilter": {"Properties": {"odd key": {"nested": 1}}},
                        },
                    }
                ],
            }
        ),
        f'{R0}.Properties.CorrelationFilter.Properties["odd key"]: a correlation filter compares with a string',
        id="correlation-property-type",
    ),
    pytest.param(
        _topic(
            sub={
                "Name": "s",
                "Rules": [
                    {"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"Lable": "x"}}}
                ],
            }
        ),
        f"{R0}.Properties.CorrelationFilter.Lable: unknown property of CorrelationFilter; did you mean 'Label'?",
        id="correlation-typo",
    ),
    pytest.param(config(namespace(Sku="Gold")), f"{NS0}.Sku: 'Gold' is not a Sku", id="sku"),
    pytest.param(
        config(namespace(Sku="Premium", PremiumMessagingPartitions=3)),
        f"{NS0}.PremiumMessagingPartitions: 3 is not a partition count",
        id="premium-partitions",
    ),
    pytest.param(
        config(namespace(PremiumMessagingPartitions=2)),
        f"{NS0}.PremiumMessagingPartitions: 2: messaging partitions are chosen only for a premium namespace",
        id="partitions-without-premium",
    ),
    pytest.param(_topic(Sku="Basic"), f"{T0}: Topics are not available in the basic tier", id="basic-topic"),
    pytest.param(
        config(namespace(Sku="Basic", Queues=[{"Name": "q", "Properties": {"RequiresSession": True}}])),
        f"{Q0}.Properties.RequiresSession: true is not allowed: Sessions are not available in the basic tier",
        id="basic-sessions",
    ),
    pytest.param(
        config(namespace("has space")), f"{NS0}.Name: 'has space' is not a valid namespace name", id="ns-name"
    ),
    pytest.param(
        config(namespace(Queues={"Name": "q"})), f"{NS0}.Queues: expected an array, not an object", id="shape"
    ),
    pytest.param(
        config(logging_type="Syslog"), "UserConfig.Logging.Type: 'Syslog' is not a logging type", id="logging"
    ),
    pytest.param(
        {"UserConfig": {"Namespaces": []}}, "UserConfig.Namespaces: list at least one namespace", id="no-namespace"
    ),
    pytest.param({"Namespaces": []}, "Namespaces: unknown property of the config root", id="no-user-config"),
]


@pytest.mark.parametrize(("data", "expected"), ERROR_CASES)
def test_config_errors_name_the_offending_path(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert str(info.value).startswith(expected), str(info.value)
    assert isinstance(info.value, shardbus.ArgumentError)
    assert expected.startswith(info.value.path)


def test_file_errors_say_which_file(tmp_path) -> None:
    bad_json = tmp_path / "broken.json"
    bad_json.write_text('{"UserConfig": {')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* \(in .*broken\.json\)"):
        load_config(bad_json)
    repeated = tmp_path / "repeated.json"
    repeated.write_text(
        '{"UserConfig": {"Namespaces": [{"Name": "n", "Queues": [{"Name": "q", "Properties": '
        '{"LockDuration": "PT1M", "LockDuration": "PT2M"}}]}]}}'
    )
    with pytest.raises(ConfigError) as info:
        load_config(repeated)
    assert str(info.value).startswith(
        "UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: is given more than once"
    )
    assert info.value.source == str(repeated)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_the_first_error_names_its_path_among_many_entities() -> None:
    data = config(namespace(Queues=[{"Name": f"q{i}", "Properties": {"LockDuration": "PT1M"}} for i in range(5)]))
    data["UserConfig"]["Namespaces"][0]["Queues"][2]["Properties"]["LockDuration"] = "PT10M"
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert str(info.value).startswith(
        "UserConfig.Namespaces[0].Queues[2].Properties.LockDuration: 'PT10M' is out of range: "
    )
    assert info.value.path == "UserConfig.Namespaces[0].Queues[2].Properties.LockDuration"


# --- errors found against the namespace: nothing is changed --------------------------------------------------


def _snapshot(ns: shardbus.Namespace) -> Any:
    return (
        sorted((q.name, q.lock_duration) for q in ns.list_queues()),
        sorted(t.name for t in ns.list_topics()),
        {t.name: sorted(s.name for s in ns.list_subscriptions(t.name)) for t in ns.list_topics()},
    )


def test_unknown_forwarding_target_fails_before_anything_is_created(open_ns) -> None:
    data = sample()
    queues = data["UserConfig"]["Namespaces"][0]["Queues"]
    queues.append({"Name": "queue.2", "Properties": {"ForwardTo": "nowhere"}})
    ns = open_ns(name="sbemulatorns")
    with pytest.raises(ConfigError) as info:
        apply_config(ns, one(data))
    assert str(info.value).startswith(
        f"{NS0}.Queues[1].Properties.ForwardTo: 'nowhere' is neither a queue or topic of namespace 'sbemulatorns'"
    )
    assert _snapshot(ns) == ([], [], {})


def test_forwarding_target_may_already_exist_in_the_namespace(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    ns.create_queue("existing")
    apply_config(ns, one(_queue(ForwardTo="existing")))
    assert ns.get_queue("q").forward_to == "existing"


def test_immutable_change_is_refused_and_nothing_else_changes(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(sample()))
    before = _snapshot(ns)
    data = sample()
    nsdata = data["UserConfig"]["Namespaces"][0]
    nsdata["Queues"][0]["Properties"]["LockDuration"] = "PT2M"  # would be fine on its own
    nsdata["Queues"].append({"Name": "queue.new"})
    nsdata["Topics"][0]["Subscriptions"][1]["Properties"]["RequiresSession"] = True
    with pytest.raises(ConfigError) as info:
        apply_config(ns, one(data))
    assert str(info.value).startswith(
        f"{T0}.Subscriptions[1].Properties.RequiresSession: true differs from the existing subscription "
        "'subscription.2' (false), and RequiresSession can only be set when a subscription is created"
    )
    assert _snapshot(ns) == before


def test_immutable_queue_partitioning(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    ns.create_queue("q")
    with pytest.raises(ConfigError, match=r"Queues\[0\]\.Properties\.EnablePartitioning: true differs"):
        apply_config(ns, one(_queue(EnablePartitioning=True)))


def test_name_taken_by_the_other_kind_of_entity(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    ns.create_topic("queue.1")
    with pytest.raises(
        ConfigError, match=r"^UserConfig\.Namespaces\[0\]\.Queues\[0\]\.Name: 'queue\.1' already exists"
    ):
        apply_config(ns, one(sample()))
    assert [q.name for q in ns.list_queues()] == []


def test_sku_partitions_and_name_must_match_the_namespace(open_ns, tmp_path) -> None:
    ns = open_ns(name="sbemulatorns")
    with pytest.raises(ConfigError, match=r"^UserConfig\.Namespaces\[0\]\.Sku: 'premium' does not match"):
        apply_config(ns, one(config(namespace(Sku="Premium"))))
    with pytest.raises(ConfigError, match=r"^UserConfig\.Namespaces\[0\]\.Name: 'other' is not the namespace"):
        apply_config(ns, one(config(namespace("other"))))
    prem = open_ns(name="p", tier="premium", premium_partitions=4)
    with pytest.raises(ConfigError, match=r"\.PremiumMessagingPartitions: 2 does not match"):
        apply_config(prem, one(config(namespace("p", Sku="Premium", PremiumMessagingPartitions=2))))
    # a namespace created in another tier cannot be re-opened with a config that says otherwise
    shardbus.Namespace.open(tmp_path / "other-data", name="n", tier="basic").close()
    with pytest.raises(ConfigError, match=r"^UserConfig\.Namespaces\[0\]: Namespace 'n' was created in the basic"):
        open_namespace(tmp_path / "other-data", one(config(namespace("n", Sku="Standard"))))


def test_validation_against_the_namespace_tier_when_the_config_has_no_sku(open_ns) -> None:
    ns = open_ns(name="sbemulatorns", tier="basic")
    with pytest.raises(ConfigError) as info:
        apply_config(ns, one(_topic()))
    assert str(info.value).startswith(f"{T0}: Topics are not available in the basic tier")
    assert ns.list_queues() == []


def test_quota_is_checked_up_front(open_ns) -> None:
    ns = open_ns(name="sbemulatorns", quotas={"max_entities": 2})
    data = config(namespace(Queues=[{"Name": f"q{i}"} for i in range(3)]))
    with pytest.raises(
        ConfigError, match="would bring namespace 'sbemulatorns' to 3 queues and topics; its quota is 2"
    ):
        apply_config(ns, one(data))
    assert ns.list_queues() == []


def test_an_unavailable_partition_stops_the_apply_before_any_change(open_ns) -> None:
    ns = open_ns(name="sbemulatorns")
    apply_config(ns, one(sample()))
    ns.faults.stop_partition("topic.1", 0)
    data = sample()
    data["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["MaxDeliveryCount"] = 9
    data["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"].append({"Name": "subscription.5"})
    with pytest.raises(shardbus.PartitionUnavailable, match=r"'topic\.1' has partitions that are unavailable"):
        apply_config(ns, one(data))
    assert ns.get_queue("queue.1").max_delivery_count == 3


def test_config_error_is_an_argument_error() -> None:
    assert issubclass(ConfigError, shardbus.ArgumentError)
    assert issubclass(ConfigError, shardbus.ShardbusError)


# ---------------------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT1M", timedelta(minutes=1)),
        ("PT1H", timedelta(hours=1)),
        ("PT20S", timedelta(seconds=20)),
        ("P1D", timedelta(days=1)),
        ("P1DT2H30M", timedelta(days=1, hours=2, minutes=30)),
        ("P2W", timedelta(days=14)),
        ("P1Y", timedelta(days=365)),  # .NET XmlConvert: a year is 365 days
        ("P1M", timedelta(days=30)),  # ... and a month 30 (P1M is not PT1M)
        ("PT1440M0S", timedelta(days=1)),  # exporters write minutes past 59
        ("PT0.5S", timedelta(milliseconds=500)),
        ("PT1,25S", timedelta(seconds=1.25)),
        ("PT1.5H", timedelta(minutes=90)),
        ("P10675199DT2H48M5.4775807S", TIMESPAN_MAX),
        ("00:01:00", timedelta(minutes=1)),
        ("1.00:00:00", timedelta(days=1)),
        ("00:00:30.5", timedelta(seconds=30.5)),
        ("02:30", timedelta(hours=2, minutes=30)),
        ("10675199.02:48:05.4775807", TIMESPAN_MAX),
        (" PT5M ", timedelta(minutes=5)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "P", "PT", "P1DT", "30", "1H", "25:00:00", "00:61:00", "P10675200D", "1:2:3:4"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_load_config_takes_a_dict_without_changing_it() -> None:
    data = sample()
    before = copy.deepcopy(data)
    load_config(data)
    assert data == before
