"""Shared access rules with rights, through the official SDK over real sockets (and SASL PLAIN through our client).

Namespace rules come from Config.json (``AuthorizationRules``) beside ``RootManageSharedAccessKey``; entity rules
from the admin client's ``authorization_rules``. A Send-only key sends and schedules but cannot receive or peek; a
Listen-only key receives, peeks and settles but cannot send; Manage does everything; either key of a rule works; an
entity's rule works for that entity (and its subscriptions) only; a key rotated through the admin client refuses
new tokens signed with the old one; entity keys survive a restart.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from azure.servicebus.management import AccessRights, AuthorizationRule, ServiceBusAdministrationClient

from management_wire import management
from shardbus.amqp.transport import AmqpClient, AmqpClientError
from shardbus.config import ConfigError, load_config
from shardbus.endpoint import rules
from shardbus.model.filters import Rule, SqlFilter
from shardbus.server import Broker

WORKERS = int(os.environ.get("SHARDBUS_TEST_WORKERS", "0"))  # as tests/conftest.py reads it
SEND_KEY, SEND_KEY_2, LISTEN_KEY, MANAGE_KEY = "c2VuZC1rZXk=", "c2Vjb25kYXJ5", "bGlzdGVuLWtleQ==", "bWFuYWdl"
CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [{"Name": "q"}, {"Name": "other"}],
                "Topics": [{"Name": "t", "Subscriptions": [{"Name": "s"}]}],
                "AuthorizationRules": [
                    {"KeyName": "sender", "PrimaryKey": SEND_KEY, "SecondaryKey": SEND_KEY_2, "Rights": ["Send"]},
                    {"KeyName": "listener", "PrimaryKey": LISTEN_KEY, "Rights": ["Listen"]},
                    {"KeyName": "admin", "PrimaryKey": MANAGE_KEY, "Rights": ["Manage", "Send", "Listen"]},
                ],
            }
        ]
    }
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(data_dir=tmp_path_factory.mktemp("sas"), port=0, config=CONFIG, workers=WORKERS).start()
    yield b
    b.stop()


def conn_str(broker: Broker, name: str, key: str) -> str:
    return (
        f"Endpoint=sb://localhost:{broker.server.port};SharedAccessKeyName={name};SharedAccessKey={key};"
        "UseDevelopmentEmulator=true"
    )


def client(broker: Broker, name: str, key: str) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(conn_str(broker, name, key), retry_total=0)


def admin(broker: Broker, name: str, key: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        conn_str(broker, name, key), connection_verify=str(broker.ca_path), retry_total=0
    )


def send_one(broker: Broker, name: str, key: str, entity: str, body: str = "x") -> None:
    with client(broker, name, key) as c, c.get_queue_sender(entity) as sender:
        sender.send_messages(ServiceBusMessage(body))


def drain(broker: Broker, entity: str) -> list[str]:
    with client(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as c:
        with c.get_queue_receiver(entity, max_wait_time=1) as r:
            got = r.receive_messages(max_message_count=50, max_wait_time=1)
            for m in got:
                r.complete_message(m)
            return [str(m) for m in got]


# --- namespace rules --------------------------------------------------------------------------------------------
def test_send_only_key_sends_and_schedules_but_cannot_receive_or_peek(broker):
    send_one(broker, "sender", SEND_KEY, "q", "by-send-key")
    with client(broker, "sender", SEND_KEY) as c:
        with c.get_queue_sender("q") as sender:
            (seq,) = sender.schedule_messages(ServiceBusMessage("later"), datetime.now(UTC) + timedelta(hours=1))
            sender.cancel_scheduled_messages(seq)
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            with c.get_queue_receiver("q", max_wait_time=1) as r:
                r.receive_messages(max_wait_time=1)
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            with c.get_queue_receiver("q") as r:
                r.peek_messages(1)
    assert drain(broker, "q") == ["by-send-key"]


def test_listen_only_key_receives_peeks_and_settles_but_cannot_send_or_schedule(broker):
    send_one(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE", "q", "for-listener")
    with client(broker, "listener", LISTEN_KEY) as c:
        with c.get_queue_receiver("q", max_wait_time=2) as r:
            assert [str(m) for m in r.peek_messages(5)] == ["for-listener"]
            got = r.receive_messages(max_wait_time=2)
            assert [str(m) for m in got] == ["for-listener"]
            r.renew_message_lock(got[0])
            r.complete_message(got[0])
        with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            with c.get_queue_sender("q") as sender:
                sender.send_messages(ServiceBusMessage("no"))
    assert drain(broker, "q") == []


def test_listen_only_key_cannot_schedule(broker):
    with client(broker, "listener", LISTEN_KEY) as c:
        sender = c.get_queue_sender("q")
        with pytest.raises(ServiceBusAuthorizationError):
            sender.schedule_messages(ServiceBusMessage("later"), datetime.now(UTC) + timedelta(hours=1))
        sender.close()


def test_secondary_key_works_and_a_wrong_key_is_refused(broker):
    send_one(broker, "sender", SEND_KEY_2, "q", "by-secondary")
    assert drain(broker, "q") == ["by-secondary"]
    with pytest.raises(ServiceBusAuthenticationError):
        send_one(broker, "sender", "d3Jvbmc=", "q")


def test_manage_key_sends_receives_and_manages(broker):
    send_one(broker, "admin", MANAGE_KEY, "q", "by-admin")
    with client(broker, "admin", MANAGE_KEY) as c, c.get_queue_receiver("q", max_wait_time=2) as r:
        got = r.receive_messages(max_wait_time=2)
        assert [str(m) for m in got] == ["by-admin"]
        r.complete_message(got[0])
    with admin(broker, "admin", MANAGE_KEY) as a:
        assert a.get_queue("q").name == "q"


def test_admin_api_needs_manage_even_for_reads(broker):
    for name, key in (("sender", SEND_KEY), ("listener", LISTEN_KEY)):
        with admin(broker, name, key) as a:
            with pytest.raises(ClientAuthenticationError, match="Manage,EntityRead claims required"):
                a.get_queue("q")
            with pytest.raises(ClientAuthenticationError, match="Manage"):
                list(a.list_rules("t", "s"))
            with pytest.raises(ClientAuthenticationError):
                a.create_queue("never")
    assert not broker.namespace.exists("never")


def test_listen_key_manages_subscription_rules_over_amqp(broker):
    """A subscription's $management node: adding, listing and removing rules needs Listen (the service lets a
    subscription's listeners manage its rules over AMQP; its HTTPS API wants Manage)."""
    rule = Rule("byListener", SqlFilter("color = 'red'"))
    add = ("com.microsoft:add-rule", {"rule-name": rule.name, "rule-description": rules.encode_rule_map(rule)})
    listed = ("com.microsoft:enumerate-rules", {"top": 10, "skip": 0})
    remove = ("com.microsoft:remove-rule", {"rule-name": rule.name})
    replies = management(broker.server.port, "t/Subscriptions/s", [add, listed, remove], "listener", LISTEN_KEY)
    assert [r.status for r in replies] == [200, 200, 200], replies
    (refused,) = management(broker.server.port, "t/Subscriptions/s", [add], "sender", SEND_KEY)
    assert (refused.status, refused.condition) == (401, "amqp:unauthorized-access")
    assert "'Listen' claim(s) are required" in refused.description


def test_plain_credentials_carry_the_rule_rights(broker):
    async def scenario() -> None:
        c = await AmqpClient.connect(
            "127.0.0.1", broker.server.port, sasl_mechanism="PLAIN", username="sender", password=SEND_KEY
        )
        try:
            session = await c.session()
            sender = await session.sender("q")
            await sender.close()
            with pytest.raises(AmqpClientError, match="Listen"):
                await session.receiver("q")
        finally:
            await c.close()
        with pytest.raises(AmqpClientError):
            await AmqpClient.connect(
                "127.0.0.1", broker.server.port, sasl_mechanism="PLAIN", username="sender", password="nope"
            )

    asyncio.run(scenario())


# --- entity rules -----------------------------------------------------------------------------------------------
def test_entity_rules_round_trip_and_authorize_only_their_entity(broker):
    rule = AuthorizationRule(
        claim_type="SharedAccessKey", key_name="qsend", primary_key="cXNlbmQ=", rights=[AccessRights.send]
    )
    with admin(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as a:
        a.create_queue("entityq", authorization_rules=[rule])
        got = a.get_queue("entityq").authorization_rules
        assert [(r.key_name, r.primary_key, list(r.rights)) for r in got] == [("qsend", "cXNlbmQ=", ["Send"])]
        assert got[0].secondary_key and got[0].created_at_utc is not None  # generated, as the service does
        assert got[0].type == "SharedAccessAuthorizationRule" and got[0].claim_type == "SharedAccessKey"
    send_one(broker, "qsend", "cXNlbmQ=", "entityq", "entity-rule")
    assert drain(broker, "entityq") == ["entity-rule"]
    with pytest.raises(ServiceBusAuthenticationError):  # no such rule on 'other': the token is refused
        send_one(broker, "qsend", "cXNlbmQ=", "other")
    with client(broker, "qsend", "cXNlbmQ=") as c:
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            with c.get_queue_receiver("entityq", max_wait_time=1) as r:
                r.receive_messages(max_wait_time=1)

    async def plain() -> None:  # SASL PLAIN with the entity rule's key: its rights on its entity, none elsewhere
        c = await AmqpClient.connect(
            "127.0.0.1", broker.server.port, sasl_mechanism="PLAIN", username="qsend", password="cXNlbmQ="
        )
        try:
            session = await c.session()
            await (await session.sender("entityq")).close()
            with pytest.raises(AmqpClientError, match="unauthorized-access"):
                await session.sender("other")
        finally:
            await c.close()

    asyncio.run(plain())


def test_topic_rule_covers_its_subscriptions(broker):
    rule = AuthorizationRule(
        claim_type="SharedAccessKey",
        key_name="tall",
        primary_key="dGFsbA==",
        rights=[AccessRights.manage, AccessRights.send, AccessRights.listen],
    )
    with admin(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as a:
        props = a.get_topic("t")
        props.authorization_rules = [rule]
        a.update_topic(props)
        assert [r.key_name for r in a.get_topic("t").authorization_rules] == ["tall"]
    with client(broker, "tall", "dGFsbA==") as c:
        with c.get_topic_sender("t") as s:
            s.send_messages(ServiceBusMessage("to-sub"))
        with c.get_subscription_receiver("t", "s", max_wait_time=2) as r:
            got = r.receive_messages(max_wait_time=2)
            assert [str(m) for m in got] == ["to-sub"]
            r.complete_message(got[0])


def test_rotating_a_key_refuses_tokens_signed_with_the_old_one(broker):
    old = AuthorizationRule(claim_type="SharedAccessKey", key_name="rot", primary_key="b2xk", rights=["Send"])
    with admin(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as a:
        a.create_queue("rotq", authorization_rules=[old])
        send_one(broker, "rot", "b2xk", "rotq")
        props = a.get_queue("rotq")
        props.authorization_rules[0].primary_key = "bmV3"
        a.update_queue(props)
        assert a.get_queue("rotq").authorization_rules[0].primary_key == "bmV3"
    with pytest.raises(ServiceBusAuthenticationError):
        send_one(broker, "rot", "b2xk", "rotq")
    send_one(broker, "rot", "bmV3", "rotq")
    assert len(drain(broker, "rotq")) == 2


def test_bad_rules_are_refused_by_the_admin_api(broker):
    from azure.core.exceptions import HttpResponseError

    manage_only = AuthorizationRule(claim_type="SharedAccessKey", key_name="m", primary_key="a", rights=["Manage"])
    with admin(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as a:
        with pytest.raises(HttpResponseError, match="Manage rights must also have Send and Listen"):
            a.create_queue("badrules", authorization_rules=[manage_only])
    assert not broker.namespace.exists("badrules")


def test_entity_keys_survive_a_restart(tmp_path):
    rule = AuthorizationRule(claim_type="SharedAccessKey", key_name="keep", primary_key="a2VlcA==", rights=["Send"])
    first = Broker(data_dir=tmp_path, port=0, config=CONFIG, workers=WORKERS).start()
    try:
        first.namespace.create_queue("keptq", authorization_rules=[rule])
        before = first.namespace.get_queue("keptq").authorization_rules
    finally:
        first.stop()
    again = Broker(data_dir=tmp_path, port=0, config=CONFIG, workers=WORKERS).start()
    try:
        assert again.namespace.get_queue("keptq").authorization_rules == before
        send_one(again, "keep", "a2VlcA==", "keptq")
        send_one(again, "sender", SEND_KEY, "keptq")
        assert len(drain(again, "keptq")) == 2
    finally:
        again.stop()


# --- Config.json ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"KeyName": "RootManageSharedAccessKey", "PrimaryKey": "k", "Rights": ["Send"]}, "serve --key"),
        ({"KeyName": "m", "PrimaryKey": "k", "Rights": ["Manage"]}, "must also have Send and Listen"),
        ({"KeyName": "m", "PrimaryKey": "k", "Rights": ["Read"]}, "Unknown access right"),
        ({"KeyName": "m", "Rights": ["Send"]}, "'PrimaryKey' is required"),
        ({"KeyName": "m", "PrimaryKey": "k", "Rights": []}, "at least one right"),
    ],
)
def test_config_rules_are_checked(rule, reason):
    config = {"UserConfig": {"Namespaces": [{"Name": "ns", "AuthorizationRules": [rule]}]}}
    with pytest.raises(ConfigError, match=reason) as info:
        load_config(config)
    assert "UserConfig.Namespaces[0].AuthorizationRules[0]" in str(info.value)


def test_keys_left_out_are_generated_like_the_services(broker):
    import base64

    rule = AuthorizationRule(claim_type="SharedAccessKey", key_name="gen", rights=[AccessRights.listen])
    with admin(broker, "RootManageSharedAccessKey", "SAS_KEY_VALUE") as a:
        a.create_queue("genq", authorization_rules=[rule])
        (got,) = a.get_queue("genq").authorization_rules
    assert got.primary_key != got.secondary_key
    assert all(len(base64.b64decode(k)) == 32 for k in (got.primary_key, got.secondary_key))
    with client(broker, "gen", got.secondary_key) as c, c.get_queue_receiver("genq", max_wait_time=1) as r:
        assert r.receive_messages(max_wait_time=1) == []
