"""Namespaces, tiers, entity properties, name rules, quotas and management on every partition."""

from __future__ import annotations

from datetime import timedelta

import pytest

import shardbus
from shardbus import Message
from shardbus.model.entities import TIMESPAN_MAX


# --- tiers -------------------------------------------------------------------------------------------------
def test_standard_partitioned_entities_have_16_partitions_beside_unpartitioned_ones(ns):
    ns.create_queue("p", enable_partitioning=True)
    ns.create_queue("plain")
    ns.create_topic("pt", enable_partitioning=True)
    assert len(ns._queue("p").partitions) == 16
    assert len(ns._queue("plain").partitions) == 1
    assert len(ns._topic("pt").partitions) == 16
    assert ns.get_queue("p").enable_partitioning and not ns.get_queue("plain").enable_partitioning


@pytest.mark.parametrize("count", [1, 2, 4])
def test_premium_partition_count_applies_to_every_entity(open_ns, count):
    ns = open_ns(tier="premium", premium_partitions=count)
    q = ns.create_queue("q", enable_partitioning=False)
    assert q.enable_partitioning is True
    assert len(ns._queue("q").partitions) == count
    ns.create_topic("t")
    assert len(ns._topic("t").partitions) == count


def test_premium_partition_count_is_validated_and_fixed(open_ns, tmp_path):
    with pytest.raises(shardbus.ArgumentOutOfRange):
        open_ns(tier="premium", premium_partitions=3)
    with pytest.raises(shardbus.ArgumentError):
        open_ns(tier="standard", premium_partitions=2)
    ns = open_ns(name="prem", tier="premium", premium_partitions=2)
    ns.close()
    with pytest.raises(shardbus.ArgumentError, match="cannot change"):
        open_ns(name="prem", tier="premium", premium_partitions=4)
    with pytest.raises(shardbus.ArgumentError, match="tier"):
        open_ns(name="prem", tier="standard")


def test_basic_tier_has_no_topics_sessions_dedup_or_forwarding(open_ns):
    ns = open_ns(tier="basic")
    ns.create_queue("q", enable_partitioning=True)
    with pytest.raises(shardbus.InvalidOperation, match="basic"):
        ns.create_topic("t")
    with pytest.raises(shardbus.InvalidOperation, match="Sessions"):
        ns.create_queue("s", requires_session=True)
    with pytest.raises(shardbus.InvalidOperation, match="Duplicate"):
        ns.create_queue("d", requires_duplicate_detection=True)
    with pytest.raises(shardbus.InvalidOperation, match="forwarding"):
        ns.create_queue("f", forward_to="q")


# --- properties ---------------------------------------------------------------------------------------------
def test_queue_defaults_match_the_service(ns):
    q = ns.create_queue("q")
    assert q.lock_duration == timedelta(minutes=1)
    assert q.max_delivery_count == 10
    assert q.default_message_time_to_live == TIMESPAN_MAX
    assert q.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert q.max_size_in_megabytes == 1024
    assert q.status == shardbus.EntityStatus.ACTIVE
    assert not q.requires_session and not q.dead_lettering_on_message_expiration


@pytest.mark.parametrize(
    "props",
    [
        {"lock_duration": timedelta(seconds=4)},
        {"lock_duration": timedelta(minutes=5, seconds=1)},
        {"duplicate_detection_history_time_window": timedelta(seconds=19)},
        {"duplicate_detection_history_time_window": timedelta(days=7, seconds=1)},
        {"max_size_in_megabytes": 1000},
        {"max_size_in_megabytes": 6144},
        {"max_delivery_count": 0},
        {"default_message_time_to_live": timedelta(0)},
        {"auto_delete_on_idle": timedelta(minutes=4)},
    ],
)
def test_out_of_range_properties_are_refused(ns, props):
    with pytest.raises(shardbus.ArgumentOutOfRange):
        ns.create_queue("q", **props)
    assert ns.list_queues() == []


@pytest.mark.parametrize("size", [1024, 2048, 3072, 4096, 5120])
def test_standard_max_sizes(ns, size):
    assert ns.create_queue(f"q{size}", max_size_in_megabytes=size).max_size_in_megabytes == size


def test_unknown_property_and_status_are_argument_errors(ns):
    with pytest.raises(shardbus.ArgumentError, match="Unknown"):
        ns.create_queue("q", lock_time=5)
    with pytest.raises(shardbus.ArgumentError, match="status"):
        ns.create_queue("q", status="Paused")


@pytest.mark.parametrize("name", ["orders", "a", "a.b-c_d", "folder/sub/q1", "x" * 260])
def test_valid_entity_names(ns, name):
    ns.create_queue(name)


@pytest.mark.parametrize("name", ["", "-q", "q-", "a//b", "/q", "q/", "q$", "sp ace", "x" * 261, "é"])
def test_invalid_entity_names(ns, name):
    with pytest.raises(shardbus.ArgumentError, match="name"):
        ns.create_queue(name)


@pytest.mark.parametrize("name", ["s/1", "x" * 51, "-s", "s!"])
def test_invalid_subscription_names(ns, name):
    ns.create_topic("t")
    with pytest.raises(shardbus.ArgumentError, match="name"):
        ns.create_subscription("t", name)


def test_names_are_case_insensitive_and_unique_across_queues_and_topics(ns):
    ns.create_queue("Orders")
    with pytest.raises(shardbus.EntityAlreadyExists):
        ns.create_queue("orders")
    with pytest.raises(shardbus.EntityAlreadyExists):
        ns.create_topic("ORDERS")
    assert ns.get_queue("ORDERS").name == "Orders"


def test_missing_entities_raise_not_found(ns):
    with pytest.raises(shardbus.EntityNotFound):
        ns.get_queue("nope")
    with pytest.raises(shardbus.EntityNotFound):
        ns.send("nope", Message(b"x"))
    with pytest.raises(shardbus.EntityNotFound):
        ns.receiver("nope")
    ns.create_topic("t")
    with pytest.raises(shardbus.EntityNotFound):
        ns.get_subscription("t", "nope")
    with pytest.raises(shardbus.EntityNotFound):
        ns.get_queue("t")  # a topic is not a queue


def test_partitioning_and_sessions_cannot_change_after_creation(ns):
    ns.create_queue("q", enable_partitioning=True)
    with pytest.raises(shardbus.InvalidOperation, match="enable_partitioning"):
        ns.update_queue("q", enable_partitioning=False)
    with pytest.raises(shardbus.InvalidOperation, match="requires_session"):
        ns.update_queue("q", requires_session=True)
    ns.create_topic("t")
    with pytest.raises(shardbus.InvalidOperation, match="enable_partitioning"):
        ns.update_topic("t", enable_partitioning=True)
    assert ns.get_queue("q").enable_partitioning


@pytest.mark.embedded_only
def test_update_changes_settings_on_every_partition(ns, clock):
    ns.create_queue("q", enable_partitioning=True)
    updated = ns.update_queue("q", lock_duration=timedelta(seconds=30), max_delivery_count=3)
    assert updated.lock_duration == timedelta(seconds=30)
    for p in ns._queue("q").partitions:
        assert p._slots[0].lock_duration_ms == 30_000
        assert p._slots[0].max_delivery_count == 3


def test_forwarding_targets_must_exist_and_differ(ns):
    ns.create_queue("dest")
    with pytest.raises(shardbus.EntityNotFound, match="forwarding"):
        ns.create_queue("src", forward_to="missing")
    with pytest.raises(shardbus.InvalidOperation, match="itself"):
        ns.create_queue("self", forward_to="self")
    q = ns.create_queue("src", forward_to="sb://localhost/dest", forward_dead_lettered_messages_to="dest")
    assert q.forward_to == "dest"


# --- status -------------------------------------------------------------------------------------------------
def test_status_controls_sending_and_receiving(ns):
    ns.create_queue("q")
    ns.update_queue("q", status="SendDisabled")
    with pytest.raises(shardbus.EntityDisabled):
        ns.send("q", Message(b"x"))
    ns.update_queue("q", status="Active")
    ns.send("q", Message(b"x"))
    ns.update_queue("q", status="ReceiveDisabled")
    ns.send("q", Message(b"y"))
    with pytest.raises(shardbus.EntityDisabled):
        ns.receiver("q")
    ns.update_queue("q", status="Disabled")
    with pytest.raises(shardbus.EntityDisabled):
        ns.send("q", Message(b"x"))
    with pytest.raises(shardbus.EntityDisabled):
        ns.receiver("q")
    ns.update_queue("q", status=shardbus.EntityStatus.ACTIVE)
    assert ns.get_runtime_properties("q").active_message_count == 2


# --- quotas -------------------------------------------------------------------------------------------------
def test_partitioned_entity_quota_per_standard_namespace(open_ns):
    ns = open_ns(quotas={"max_partitioned_entities": 3})
    ns.create_queue("a", enable_partitioning=True)
    ns.create_topic("b", enable_partitioning=True)
    ns.create_queue("c", enable_partitioning=True)
    with pytest.raises(shardbus.QuotaExceeded, match="partitioned"):
        ns.create_queue("d", enable_partitioning=True)
    ns.create_queue("d")  # unpartitioned entities are not limited by it


def test_default_quotas_are_the_services():
    q = shardbus.Quotas.for_tier(shardbus.Tier.STANDARD)
    assert (q.max_partitioned_entities, q.max_entities, q.max_message_size_bytes) == (100, 10_000, 256 * 1024)
    p = shardbus.Quotas.for_tier(shardbus.Tier.PREMIUM)
    assert p.max_message_size_bytes == 100 * 1024 * 1024


def test_entity_count_quota_and_persistence_of_quotas(open_ns):
    ns = open_ns(quotas={"max_entities": 2})
    ns.create_queue("a")
    ns.create_topic("b")
    with pytest.raises(shardbus.QuotaExceeded, match="maximum number"):
        ns.create_queue("c")
    ns.close()
    again = open_ns()
    assert again.quotas.max_entities == 2


def test_message_size_limit_standard(ns):
    ns.create_queue("q")
    ns.send("q", Message(b"x" * (250 * 1024)))
    with pytest.raises(shardbus.MessageSizeExceeded):
        ns.send("q", Message(b"x" * (257 * 1024)))
    assert ns.get_runtime_properties("q").active_message_count == 1


def test_message_size_limit_premium(open_ns):
    ns = open_ns(tier="premium")
    ns.create_queue("q")
    ns.send("q", Message(b"x" * (1023 * 1024)))
    with pytest.raises(shardbus.MessageSizeExceeded):  # 1 MB of body and its headers: over, as over AMQP
        ns.send("q", Message(b"x" * (1024 * 1024)))


@pytest.mark.embedded_only
def test_entity_max_size_is_enforced_per_partition(open_ns):
    ns = open_ns()
    ns.create_queue("q", enable_partitioning=True, max_size_in_megabytes=1024)
    p = ns._queue("q").partitions[partition_of("k", 16)]
    p.config.max_size_bytes = 100_000  # shrink the share to make the test small
    ns.send("q", [Message(b"x" * 40_000, partition_key="k"), Message(b"x" * 40_000, partition_key="k")])
    with pytest.raises(shardbus.QuotaExceeded, match="maximum entity size"):
        ns.send("q", Message(b"x" * 40_000, partition_key="k"))
    ns.send("q", Message(b"x" * 40_000))  # keyless sends land elsewhere


def partition_of(key: str, n: int) -> int:
    from shardbus.model.routing import partition_for_key

    return partition_for_key(key, n)


# --- subscriptions and rules --------------------------------------------------------------------------------
def test_new_subscription_gets_default_true_rule(ns):
    ns.create_topic("t")
    ns.create_subscription("t", "s")
    rules = ns.list_rules("t", "s")
    assert [r.name for r in rules] == ["$Default"]
    assert isinstance(rules[0].filter, shardbus.TrueFilter)


def test_rule_management(ns):
    ns.create_topic("t")
    ns.create_subscription("t", "s")
    ns.create_rule("t", "s", shardbus.Rule("red", shardbus.SqlFilter("color = 'red'")))
    with pytest.raises(shardbus.EntityAlreadyExists):
        ns.create_rule("t", "s", shardbus.Rule("RED", shardbus.TrueFilter()))
    assert ns.get_rule("t", "s", "Red").name == "red"
    ns.delete_rule("t", "s", "red")
    with pytest.raises(shardbus.EntityNotFound):
        ns.get_rule("t", "s", "red")


def test_delete_topic_removes_subscriptions_and_files(ns):
    ns.create_topic("t", enable_partitioning=True)
    ns.create_subscription("t", "s")
    ns.send("t", Message(b"x"))
    folder = ns.root / "entities" / str(ns._topic("t").entity_id)
    assert len(list(folder.glob("p*.db"))) == 16
    ns.delete_topic("t")
    assert not folder.exists()
    with pytest.raises(shardbus.EntityNotFound):
        ns.get_subscription("t", "s")
    ns.create_topic("t")
    ns.create_subscription("t", "s")
    assert ns.get_runtime_properties("t/Subscriptions/s").active_message_count == 0


# --- management on every partition, with faults ------------------------------------------------------------
def test_create_fails_whole_when_a_partition_store_is_unavailable(ns):
    ns.faults.block_store("q", 7)
    with pytest.raises(shardbus.PartitionUnavailable, match="create"):
        ns.create_queue("q", enable_partitioning=True)
    assert ns.list_queues() == []
    assert not any((ns.root / "entities").glob("*/p*.db"))
    ns.faults.unblock_store("q", 7)
    ns.create_queue("q", enable_partitioning=True)


def test_update_and_delete_fail_while_a_partition_is_down(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.faults.stop_partition("q", 3)
    with pytest.raises(shardbus.PartitionUnavailable, match="partition"):
        ns.update_queue("q", max_delivery_count=2)
    assert ns.get_queue("q").max_delivery_count == 10
    with pytest.raises(shardbus.PartitionUnavailable):
        ns.delete_queue("q")
    assert ns.get_queue("q")
    ns.faults.restore_partition("q", 3)
    ns.update_queue("q", max_delivery_count=2)
    ns.delete_queue("q")


def test_subscription_management_needs_every_topic_partition(ns):
    ns.create_topic("t", enable_partitioning=True)
    ns.faults.stop_partition("t", 0)
    with pytest.raises(shardbus.PartitionUnavailable):
        ns.create_subscription("t", "s")
    ns.faults.restore_partition("t", 0)
    ns.create_subscription("t", "s")


def test_runtime_counts_are_summed_and_availability_limited(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(32):
        ns.send("q", Message(f"m{i}", partition_key=f"k{i}"))
    props = ns.get_runtime_properties("q")
    assert props.active_message_count == 32
    assert props.availability == "Available"
    assert props.size_in_bytes > 32 * 2
    assert sum(p.get("active", 0) for p in props.partitions) == 32
    ns.faults.stop_partition("q", 5)
    limited = ns.get_runtime_properties("q")
    assert limited.availability == "Limited"
    assert ns.availability("q") == "Limited"
    assert limited.active_message_count < 32
    ns.faults.restore_partition("q", 5)
    assert ns.get_runtime_properties("q").active_message_count == 32
