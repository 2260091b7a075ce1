"""The official ``ServiceBusAdministrationClient`` (sync) against shardbus over HTTPS on the AMQP port.

Every operation of SERVICEBUS_AMQP.md §10.3 with the properties the SDK sends, the service's errors (404, 409,
400 with the reason, 412 on updating a missing entity, 401), partitioning that cannot change, runtime counts summed
over partitions, availability 'Limited' while a partition is down, paging, the older api-versions, and the data
plane on the same port afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

import shardbus

NEVER_DAYS = 10675199  # TimeSpan.MaxValue, the service's "never", which the SDK reads as about 29,227 years


@pytest.fixture(scope="module")
def admin(broker):
    client = ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.ca_path), retry_total=0
    )
    with client:
        yield client


# --- namespace -----------------------------------------------------------------------------------------------------
def test_namespace_properties(admin, ns):
    props = admin.get_namespace_properties()
    assert props.name == ns.name
    assert props.messaging_sku == "Standard"
    assert props.namespace_type == "Messaging"
    assert props.created_at_utc is not None


# --- queues --------------------------------------------------------------------------------------------------------
def test_queue_lifecycle_with_every_property(admin, ns, name):
    target, dlq_target, q = name("fwd"), name("dlqfwd"), name("q")
    admin.create_queue(target)
    admin.create_queue(dlq_target)
    created = admin.create_queue(
        q,
        lock_duration=timedelta(seconds=45),
        max_size_in_megabytes=2048,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=3),
        requires_session=True,
        default_message_time_to_live=timedelta(days=1),
        dead_lettering_on_message_expiration=True,
        max_delivery_count=5,
        enable_batched_operations=True,
        enable_partitioning=True,
        auto_delete_on_idle=timedelta(hours=2),
        user_metadata="owner=team-7",
        forward_dead_lettered_messages_to=dlq_target,
    )
    assert created.name == q
    got = admin.get_queue(q)
    assert got.lock_duration == timedelta(seconds=45)
    assert got.max_size_in_megabytes == 2048
    assert got.requires_duplicate_detection is True
    assert got.duplicate_detection_history_time_window == timedelta(minutes=3)
    assert got.requires_session is True
    assert got.default_message_time_to_live == timedelta(days=1)
    assert got.dead_lettering_on_message_expiration is True
    assert got.max_delivery_count == 5
    assert got.enable_partitioning is True
    assert got.auto_delete_on_idle == timedelta(hours=2)
    assert got.user_metadata == "owner=team-7"
    assert got.forward_dead_lettered_messages_to.endswith(f"/{dlq_target}")
    assert got.forward_to is None
    assert got.status == "Active"
    assert got.availability_status == "Available"
    # the namespace itself agrees
    desc = ns.get_queue(q)
    assert desc.enable_partitioning and desc.requires_session and desc.max_delivery_count == 5
    assert len(ns._queue(q).partitions) == 16

    got.max_delivery_count = 8
    got.lock_duration = timedelta(seconds=20)
    got.user_metadata = "owner=team-8"
    got.forward_to = target
    admin.update_queue(got)
    admin.update_queue(admin.get_queue(q), status="SendDisabled", default_message_time_to_live=timedelta(hours=1))
    updated = admin.get_queue(q)
    assert updated.max_delivery_count == 8
    assert updated.lock_duration == timedelta(seconds=20)
    assert updated.user_metadata == "owner=team-8"
    assert updated.forward_to.endswith(f"/{target}")
    assert updated.status == "SendDisabled"
    assert updated.default_message_time_to_live == timedelta(hours=1)
    assert ns.get_queue(q).forward_to == target

    assert q in [p.name for p in admin.list_queues()]
    admin.delete_queue(q)
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue(q)
    assert q not in [p.name for p in admin.list_queues()]


def test_queue_defaults_are_the_services(admin, name):
    q = name("q")
    got = admin.create_queue(q)
    assert got.lock_duration == timedelta(minutes=1)
    assert got.max_delivery_count == 10
    assert got.default_message_time_to_live.days == NEVER_DAYS
    assert got.auto_delete_on_idle.days == NEVER_DAYS
    assert got.enable_partitioning is False
    assert got.requires_session is False
    assert got.max_size_in_megabytes == 1024


def test_queue_errors(admin, name):
    q = name("q")
    admin.create_queue(q)
    with pytest.raises(ResourceExistsError):
        admin.create_queue(q)
    with pytest.raises(ResourceExistsError):
        admin.create_queue(q.upper())  # names compare case-insensitively
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue(name("missing"))
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue_runtime_properties(name("missing"))
    with pytest.raises(ResourceNotFoundError):
        admin.delete_queue(name("missing"))
    ghost = admin.get_queue(q)
    ghost.name = name("missing")
    with pytest.raises(ResourceNotFoundError):  # 412 on update, as the service answers If-Match: * on nothing
        admin.update_queue(ghost)
    with pytest.raises(HttpResponseError) as info:
        admin.create_queue(name("q"), lock_duration=timedelta(minutes=10))
    assert info.value.status_code == 400
    assert "LockDuration" in str(info.value)
    with pytest.raises(HttpResponseError) as info:
        admin.create_queue(name("q"), max_size_in_megabytes=1000)
    assert info.value.status_code == 400 and "MaxSizeInMegabytes" in str(info.value)
    with pytest.raises(HttpResponseError) as info:
        admin.create_queue("bad name!")
    assert info.value.status_code == 400
    with pytest.raises(ResourceNotFoundError):
        admin.create_queue(name("q"), forward_to=name("missing"))


def test_partitioning_cannot_change(admin, ns, name):
    q, t = name("q"), name("t")
    admin.create_queue(q, enable_partitioning=False)
    admin.create_topic(t, enable_partitioning=True)
    props = admin.get_queue(q)
    props.enable_partitioning = True
    with pytest.raises(HttpResponseError) as info:
        admin.update_queue(props)
    assert info.value.status_code == 400
    assert "enable_partitioning" in str(info.value)
    with pytest.raises(HttpResponseError) as info:
        admin.update_topic(admin.get_topic(t), enable_partitioning=False)
    assert info.value.status_code == 400
    assert ns.get_queue(q).enable_partitioning is False
    assert ns.get_topic(t).enable_partitioning is True
    with pytest.raises(HttpResponseError) as info:  # sessions are fixed at creation too
        admin.update_queue(admin.get_queue(q), requires_session=True)
    assert info.value.status_code == 400


def test_runtime_properties_sum_over_partitions(admin, ns, name):
    q = name("q")
    admin.create_queue(q, enable_partitioning=True)
    ns.send(q, [shardbus.Message(f"m{i}".encode(), partition_key="k1") for i in range(3)])
    for key in ("k2", "k3", "k4"):
        ns.send(q, shardbus.Message(b"x" * 100, partition_key=key))
    ns.schedule_messages(q, shardbus.Message(b"later", partition_key="k5"), datetime.now(UTC) + timedelta(hours=1))
    with ns.receiver(q) as receiver:
        first = receiver.receive(max_count=1, max_wait=5)
        receiver.dead_letter(first[0], "test", "dead-lettered by the test")
    expected = ns.get_runtime_properties(q)
    assert len([p for p in expected.partitions if p.get("active")]) > 1  # spread over several partitions
    rt = admin.get_queue_runtime_properties(q)
    assert rt.active_message_count == 5
    assert rt.dead_letter_message_count == 1
    assert rt.scheduled_message_count == 1
    assert rt.transfer_message_count == 0 and rt.transfer_dead_letter_message_count == 0
    assert rt.total_message_count == 7
    assert rt.size_in_bytes == expected.size_in_bytes > 0
    assert rt.created_at_utc is not None and rt.updated_at_utc is not None
    listed = {r.name: r for r in admin.list_queues_runtime_properties()}
    assert listed[q].active_message_count == 5


def test_availability_limited_while_a_partition_is_down(admin, ns, name):
    q = name("q")
    admin.create_queue(q, enable_partitioning=True)
    ns.send(q, shardbus.Message(b"x", partition_key="a"))
    ns.faults.stop_partition(q, 3)
    try:
        assert admin.get_queue(q).availability_status == "Limited"
        assert admin.get_queue_runtime_properties(q).name == q
        assert {p.name: p.availability_status for p in admin.list_queues()}[q] == "Limited"
    finally:
        ns.faults.restore_partition(q, 3)
    assert admin.get_queue(q).availability_status == "Available"


def test_list_paging(admin, ns, name):
    prefix = name("page")
    for i in range(5):
        admin.create_queue(f"{prefix}-{i}")
    pages = list(admin.list_queues(max_page_size=2).by_page())
    assert all(len(list(p)) <= 2 for p in list(admin.list_queues(max_page_size=2).by_page()))
    assert len(pages) >= 3
    names = [q.name for q in admin.list_queues(max_page_size=2)]
    assert [n for n in names if n.startswith(prefix)] == [f"{prefix}-{i}" for i in range(5)]
    assert len(names) == len(set(names)) == len(ns.list_queues())


# --- topics, subscriptions, rules ----------------------------------------------------------------------------------
def test_topic_lifecycle(admin, ns, name):
    t = name("t")
    admin.create_topic(
        t,
        default_message_time_to_live=timedelta(hours=6),
        max_size_in_megabytes=3072,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=2),
        enable_partitioning=True,
        support_ordering=True,
        auto_delete_on_idle=timedelta(days=3),
        user_metadata="topic meta",
    )
    got = admin.get_topic(t)
    assert got.default_message_time_to_live == timedelta(hours=6)
    assert got.max_size_in_megabytes == 3072
    assert got.requires_duplicate_detection is True
    assert got.duplicate_detection_history_time_window == timedelta(minutes=2)
    assert got.enable_partitioning is True
    assert got.auto_delete_on_idle == timedelta(days=3)
    assert got.user_metadata == "topic meta"
    assert got.availability_status == "Available"
    admin.update_topic(got, max_size_in_megabytes=4096, status="Disabled")
    again = admin.get_topic(t)
    assert again.max_size_in_megabytes == 4096 and again.status == "Disabled"
    assert ns.get_topic(t).status == "Disabled"
    admin.create_subscription(t, "s1")
    admin.create_subscription(t, "s2")
    rt = admin.get_topic_runtime_properties(t)
    assert rt.subscription_count == 2
    assert {r.name: r.subscription_count for r in admin.list_topics_runtime_properties()}[t] == 2
    assert t in [x.name for x in admin.list_topics()]
    with pytest.raises(ResourceExistsError):
        admin.create_topic(t)
    with pytest.raises(ResourceExistsError):  # queues and topics share one name space
        admin.create_queue(t)
    admin.delete_topic(t)
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic(t)
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription(t, "s1")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_topic(t)


def test_subscription_lifecycle(admin, ns, name):
    t, target = name("t"), name("fwd")
    admin.create_topic(t)
    admin.create_queue(target)
    admin.create_subscription(
        t,
        "sub",
        lock_duration=timedelta(seconds=30),
        requires_session=True,
        default_message_time_to_live=timedelta(minutes=30),
        dead_lettering_on_message_expiration=True,
        dead_lettering_on_filter_evaluation_exceptions=False,
        max_delivery_count=3,
        auto_delete_on_idle=timedelta(hours=1),
        user_metadata="sub meta",
        forward_dead_lettered_messages_to=target,
    )
    got = admin.get_subscription(t, "sub")
    assert got.lock_duration == timedelta(seconds=30)
    assert got.requires_session is True
    assert got.default_message_time_to_live == timedelta(minutes=30)
    assert got.dead_lettering_on_message_expiration is True
    assert got.dead_lettering_on_filter_evaluation_exceptions is False
    assert got.max_delivery_count == 3
    assert got.auto_delete_on_idle == timedelta(hours=1)
    assert got.user_metadata == "sub meta"
    assert got.forward_dead_lettered_messages_to.endswith(f"/{target}")
    assert got.availability_status == "Available"
    admin.update_subscription(t, got, max_delivery_count=9, forward_to=target, status="ReceiveDisabled")
    again = admin.get_subscription(t, "sub")
    assert again.max_delivery_count == 9 and again.status == "ReceiveDisabled"
    assert again.forward_to.endswith(f"/{target}")
    assert ns.get_subscription(t, "sub").forward_to == target
    with pytest.raises(HttpResponseError) as info:
        admin.update_subscription(t, again, requires_session=False)
    assert info.value.status_code == 400

    assert [s.name for s in admin.list_subscriptions(t)] == ["sub"]
    ns.send(t, shardbus.Message(b"hello"))
    rt = admin.get_subscription_runtime_properties(t, "sub")
    assert rt.total_message_count >= 0 and rt.name == "sub"
    assert [r.name for r in admin.list_subscriptions_runtime_properties(t)] == ["sub"]

    with pytest.raises(ResourceExistsError):
        admin.create_subscription(t, "sub")
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription(t, "nope")
    with pytest.raises(ResourceNotFoundError):
        admin.create_subscription(name("missing"), "sub")
    ghost = admin.get_subscription(t, "sub")
    ghost.name = "ghost"
    with pytest.raises(ResourceNotFoundError):
        admin.update_subscription(t, ghost)
    with pytest.raises(HttpResponseError) as info:
        admin.create_subscription(t, "bad", lock_duration=timedelta(seconds=1))
    assert info.value.status_code == 400
    admin.delete_subscription(t, "sub")
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription(t, "sub")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_subscription(t, "sub")


def test_subscription_counts(admin, ns, name):
    t = name("t")
    admin.create_topic(t, enable_partitioning=True)
    admin.create_subscription(t, "s")
    for key in ("a", "b", "c"):
        ns.send(t, shardbus.Message(b"payload", partition_key=key))
    with ns.receiver(f"{t}/Subscriptions/s") as receiver:
        receiver.dead_letter(receiver.receive(max_count=1, max_wait=5)[0], "r", "d")
    rt = admin.get_subscription_runtime_properties(t, "s")
    assert rt.active_message_count == 2
    assert rt.dead_letter_message_count == 1
    assert rt.total_message_count == 3


def test_rules(admin, ns, name):
    t = name("t")
    admin.create_topic(t)
    admin.create_subscription(t, "s")
    default = admin.get_rule(t, "s", "$Default")
    assert isinstance(default.filter, TrueRuleFilter)

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    params = {"@s": "red", "@i": 7, "@l": 2**40, "@f": 1.5, "@b": True, "@d": when, "@t": timedelta(minutes=5)}
    admin.create_rule(
        t,
        "s",
        "sql",
        filter=SqlRuleFilter("color = @s AND n > @i", params),
        action=SqlRuleAction("SET seen = @x; REMOVE tmp", {"@x": "yes"}),
    )
    admin.create_rule(
        t,
        "s",
        "corr",
        filter=CorrelationRuleFilter(
            correlation_id="cid",
            message_id="mid",
            to="to",
            reply_to="rt",
            label="subj",
            session_id="sid",
            reply_to_session_id="rsid",
            content_type="application/json",
            properties={"k": 5, "flag": False},
        ),
    )
    admin.create_rule(t, "s", "never", filter=FalseRuleFilter())
    admin.create_rule(t, "s", "always", filter=TrueRuleFilter())

    sql = admin.get_rule(t, "s", "sql")
    assert isinstance(sql.filter, SqlRuleFilter)
    assert sql.filter.sql_expression == "color = @s AND n > @i"
    assert dict(sql.filter.parameters) == params
    assert isinstance(sql.action, SqlRuleAction)
    assert sql.action.sql_expression == "SET seen = @x; REMOVE tmp"
    assert dict(sql.action.parameters) == {"@x": "yes"}
    corr = admin.get_rule(t, "s", "corr").filter
    assert isinstance(corr, CorrelationRuleFilter)
    assert (corr.correlation_id, corr.message_id, corr.to) == ("cid", "mid", "to")
    assert (corr.reply_to, corr.label) == ("rt", "subj")
    assert (corr.session_id, corr.reply_to_session_id, corr.content_type) == ("sid", "rsid", "application/json")
    assert dict(corr.properties) == {"k": 5, "flag": False}
    assert isinstance(admin.get_rule(t, "s", "never").filter, FalseRuleFilter)
    assert isinstance(admin.get_rule(t, "s", "always").filter, TrueRuleFilter)
    stored = {r.name: r for r in ns.list_rules(t, "s")}
    assert isinstance(stored["never"].filter, shardbus.FalseFilter)
    assert stored["corr"].filter.subject == "subj"

    assert [r.name for r in admin.list_rules(t, "s")] == sorted(["$Default", "sql", "corr", "never", "always"])
    topic_rt = admin.get_topic_runtime_properties(t)
    assert topic_rt.subscription_count == 1

    rule = admin.get_rule(t, "s", "sql")
    rule.filter = SqlRuleFilter("size > 10")
    rule.action = None
    admin.update_rule(t, "s", rule)
    changed = admin.get_rule(t, "s", "sql")
    assert changed.filter.sql_expression == "size > 10" and changed.action is None

    with pytest.raises(ResourceExistsError):
        admin.create_rule(t, "s", "sql")
    with pytest.raises(ResourceNotFoundError):
        admin.get_rule(t, "s", "nope")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_rule(t, "s", "nope")
    ghost = admin.get_rule(t, "s", "sql")
    ghost.name = "ghost"
    with pytest.raises(ResourceNotFoundError):
        admin.update_rule(t, "s", ghost)
    with pytest.raises(HttpResponseError) as info:
        admin.create_rule(t, "s", "broken", filter=SqlRuleFilter("color = = 'x'"))
    assert info.value.status_code == 400
    rule = admin.get_rule(t, "s", "sql")
    rule.filter = SqlRuleFilter("((")
    with pytest.raises(HttpResponseError):
        admin.update_rule(t, "s", rule)
    assert admin.get_rule(t, "s", "sql").filter.sql_expression == "size > 10"  # a failed update changes nothing

    for rule_name in ("$Default", "sql", "corr", "never", "always"):
        admin.delete_rule(t, "s", rule_name)
    assert list(admin.list_rules(t, "s")) == []


@pytest.mark.parametrize("version", ["2021-05", "2017-04"])
def test_older_api_versions(broker, name, version):
    q = name("q")
    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.ca_path), api_version=version
    ) as client:
        client.create_queue(q, max_delivery_count=4)
        assert client.get_queue(q).max_delivery_count == 4
        assert q in [p.name for p in client.list_queues()]
        client.delete_queue(q)


# --- authorization ---------------------------------------------------------------------------------------------------
def test_wrong_key_is_refused(broker):
    bad = broker.connection_string.replace(f"SharedAccessKey={broker.key}", "SharedAccessKey=wrong")
    with ServiceBusAdministrationClient.from_connection_string(bad, connection_verify=str(broker.ca_path)) as client:
        with pytest.raises(ClientAuthenticationError):
            client.get_namespace_properties()
        with pytest.raises(ClientAuthenticationError):
            client.create_queue("never-created")
    assert "never-created" not in [q.name for q in broker.namespace.list_queues()]


def test_certificate_is_verified(broker, tmp_path):
    from azure.core.exceptions import ServiceRequestError

    with ServiceBusAdministrationClient.from_connection_string(broker.connection_string, retry_total=0) as client:
        with pytest.raises(ServiceRequestError):  # not trusted without the CA
            client.get_namespace_properties()


# --- the data plane on the same port -------------------------------------------------------------------------------
def test_data_plane_works_after_https_traffic(admin, conn_str, name):
    q, t = name("q"), name("t")
    admin.create_queue(q, enable_partitioning=True, max_delivery_count=2)
    admin.create_topic(t)
    admin.create_subscription(t, "red")
    admin.delete_rule(t, "red", "$Default")
    admin.create_rule(t, "red", "only-red", filter=SqlRuleFilter("color = 'red'"))
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", partition_key="p") for i in range(3)])
        with client.get_topic_sender(t) as sender:
            sender.send_messages(ServiceBusMessage("r", application_properties={"color": "red"}))
            sender.send_messages(ServiceBusMessage("b", application_properties={"color": "blue"}))
        assert admin.get_queue_runtime_properties(q).active_message_count == 3
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=3, max_wait_time=5)
            for m in got:
                receiver.complete_message(m)
        assert sorted(str(m) for m in got) == ["m0", "m1", "m2"]
        with client.get_subscription_receiver(t, "red", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=1)
            for m in got:
                receiver.complete_message(m)
        assert [str(m) for m in got] == ["r"]
    assert admin.get_queue_runtime_properties(q).total_message_count == 0
