"""Namespace.update_rule: a rule's filter and action replaced in place, kept in its position, persisted."""

from __future__ import annotations

import pytest

import shardbus
from shardbus import Message, Rule, SqlFilter


def _topic_with_rules(ns) -> None:
    ns.create_topic("t")
    ns.create_subscription("t", "s")
    ns.create_rule("t", "s", Rule("Red", SqlFilter("color = 'red'")))
    ns.create_rule("t", "s", Rule("blue", SqlFilter("color = 'blue'")))


def test_update_replaces_filter_and_action_keeping_position_and_name(ns):
    _topic_with_rules(ns)
    action = shardbus.SqlRuleAction("SET tagged = 'yes'")
    stored = ns.update_rule("t", "s", Rule("RED", SqlFilter("color = 'green'"), action))
    assert stored.name == "Red"  # the stored name (and its case) is kept
    rules = ns.list_rules("t", "s")
    assert [r.name for r in rules] == ["$Default", "Red", "blue"]
    assert rules[1].filter == SqlFilter("color = 'green'")
    assert rules[1].action == action
    assert ns.get_rule("t", "s", "red") == stored


def test_update_changes_routing_at_once(ns):
    ns.create_topic("t")
    ns.create_subscription("t", "s")
    ns.update_rule("t", "s", Rule("$Default", SqlFilter("color = 'red'"), shardbus.SqlRuleAction("SET seen = 1")))
    ns.send("t", [Message(b"blue", application_properties={"color": "blue"})])
    ns.send("t", [Message(b"red", application_properties={"color": "red"})])
    with ns.receiver("t/Subscriptions/s", mode="receive_and_delete") as r:
        got = r.receive(10, max_wait=0.5)
    assert [m.body for m in got] == [b"red"]
    assert got[0].application_properties["seen"] == 1


def test_update_is_persisted_in_place(open_ns):
    ns = open_ns()
    _topic_with_rules(ns)
    ns.update_rule("t", "s", Rule("red", shardbus.CorrelationFilter(subject="paint")))
    ns.close()
    again = open_ns()
    rules = again.list_rules("t", "s")
    assert [r.name for r in rules] == ["$Default", "Red", "blue"]
    assert rules[1].filter == shardbus.CorrelationFilter(subject="paint")
    assert rules[2].filter == SqlFilter("color = 'blue'")


def test_update_of_missing_rule_subscription_or_topic_is_entity_not_found(ns):
    _topic_with_rules(ns)
    with pytest.raises(shardbus.EntityNotFound, match="nope"):
        ns.update_rule("t", "s", Rule("nope", shardbus.TrueFilter()))
    with pytest.raises(shardbus.EntityNotFound):
        ns.update_rule("t", "missing", Rule("Red", shardbus.TrueFilter()))
    with pytest.raises(shardbus.EntityNotFound):
        ns.update_rule("missing", "s", Rule("Red", shardbus.TrueFilter()))
    assert [r.name for r in ns.list_rules("t", "s")] == ["$Default", "Red", "blue"]


def test_update_needs_every_partition_and_changes_nothing_otherwise(ns):
    ns.create_topic("t", enable_partitioning=True)
    ns.create_subscription("t", "s")
    ns.faults.stop_partition("t", 3)
    with pytest.raises(shardbus.PartitionUnavailable):
        ns.update_rule("t", "s", Rule("$Default", shardbus.FalseFilter()))
    assert isinstance(ns.get_rule("t", "s", "$Default").filter, shardbus.TrueFilter)
    ns.faults.restore_partition("t", 3)
    ns.update_rule("t", "s", Rule("$Default", shardbus.FalseFilter()))
    assert isinstance(ns.get_rule("t", "s", "$Default").filter, shardbus.FalseFilter)
