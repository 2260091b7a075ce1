"""The explorer in a real browser (headless Chromium through Playwright) against a real broker, with the official
SDK on the other side: sign-in, a partition seen down, a peeked SDK message, a resubmitted dead letter, the CSRF
check, sending from the page."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import time
import urllib.parse

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from shardbus import Message
from shardbus.model.routing import decode_sequence_number
from shardbus.server import DEFAULT_KEY, DEFAULT_KEY_NAME


def sign_in(context, base: str, key: str = DEFAULT_KEY):
    page = context.new_page()
    page.goto(f"{base}/signin")
    page.fill("input[name=key_name]", DEFAULT_KEY_NAME)
    page.fill("input[name=key]", key)
    with page.expect_navigation():
        page.click("form[action='/explorer/signin'] button[type=submit]")
    return page


def test_sign_in_and_see_the_namespace(context, base, ns, name):
    q, t = name("q"), name("t")
    ns.create_queue(q, enable_partitioning=True)
    ns.create_topic(t)
    ns.create_subscription(t, "audit")
    page = sign_in(context, base)
    assert page.url.rstrip("/").endswith("/explorer")
    row = page.locator(f"#queues tr[data-entity='{q}']")
    assert "16" in row.inner_text() and "Available" in row.inner_text()
    assert page.locator(f"#topics tr[data-entity='{t}/Subscriptions/audit']").count() == 1
    cookie = next(c for c in context.cookies() if c["name"] == "shardbus_explorer")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/explorer"
    assert DEFAULT_KEY not in page.content()  # the key is never shown again


def test_a_wrong_key_is_refused(context, base):
    page = context.new_page()
    page.goto(f"{base}/signin")
    page.fill("input[name=key_name]", DEFAULT_KEY_NAME)
    page.fill("input[name=key]", "not-the-key")
    with page.expect_response(lambda r: r.url.endswith("/explorer/signin") and r.request.method == "POST") as info:
        page.click("button[type=submit]")
    assert info.value.status == 401
    assert "invalid signature" in page.locator(".error").inner_text()
    assert not [c for c in context.cookies() if c["name"] == "shardbus_explorer"]
    assert page.input_value("input[name=key]") == ""  # the key is not echoed back
    assert context.new_page().goto(base).status == 401  # still no session


def test_without_a_session_pages_and_data_answer_401(broker, base):
    def get(path: str, method: str = "GET", body: str | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", broker.server.port, timeout=10)
        headers = {"content-type": "application/x-www-form-urlencoded"} if body else {}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        return r.status, text

    status, text = get("/explorer")
    assert status == 401 and 'action="/explorer/signin"' in text  # the sign-in page
    for path in ("/explorer/entity?path=x", "/explorer/messages?path=x", "/explorer/partitions?path=x"):
        assert get(path)[0] == 401
    assert get("/explorer/send", "POST", "path=x&body=y")[0] == 401
    assert get("/explorer/static/explorer.js")[0] == 200  # the package's own files need no session


def test_the_session_cookie_is_secure_over_https(broker):
    context = ssl.create_default_context(cafile=str(broker.ca_path))
    conn = http.client.HTTPSConnection("localhost", broker.server.port, context=context, timeout=10)
    body = urllib.parse.urlencode({"connection_string": broker.connection_string})
    conn.request("POST", "/explorer/signin", body=body, headers={"content-type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    r.read()
    cookie = r.getheader("set-cookie")
    assert r.status == 303 and cookie.startswith("shardbus_explorer=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/explorer", "Max-Age="):
        assert attribute in cookie
    conn.request("GET", "/explorer", headers={"cookie": cookie.split(";")[0]})
    r = conn.getresponse()
    assert r.status == 200 and "Namespace" in r.read().decode()
    conn.close()


def test_a_partition_down_is_marked_and_comes_back(context, base, ns, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    ns.faults.stop_partition(q, 3)
    try:
        page = sign_in(context, base)
        page.goto(f"{base}/entity?path={q}")
        assert page.locator("#availability").inner_text() == "Limited"
        down = page.locator("#partitions tr[data-partition='3']")
        assert "down" in down.get_attribute("class") and "DOWN" in down.inner_text()
        assert page.locator("svg.heat g[data-partition='3'][data-down]").count() == 1
        assert page.locator("#partitions tr.down").count() == 1
        overview = context.new_page()
        overview.goto(base)
        row = overview.locator(f"#queues tr[data-entity='{q}']").inner_text()
        assert "Limited" in row and "partition 3 down" in row
        overview.close()
    finally:
        ns.faults.restore_partition(q, 3)
    # the panel refreshes itself: partition 3 turns healthy without a reload
    page.wait_for_selector("#partitions tr[data-partition='3']:not(.down)", timeout=15_000)
    assert page.locator("svg.heat g[data-down]").count() == 0


def test_peek_a_message_sent_by_the_sdk(context, base, ns, conn_str, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender(q) as sender:
        sender.send_messages(
            ServiceBusMessage(
                json.dumps({"order": 42, "items": ["a", "b"]}),
                message_id="order-42",
                content_type="application/json",
                partition_key="customer-7",
                application_properties={"region": "west", "priority": 3},
            )
        )
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_receiver(q) as receiver:
        (peeked,) = receiver.peek_messages(1)
    page = sign_in(context, base)
    page.goto(f"{base}/messages?path={q}&queue=active")
    row = page.locator(f"#messages tr[data-seq='{peeked.sequence_number}']")
    assert "order-42" in row.inner_text() and "customer-7" in row.inner_text()
    row.locator("a").first.click()
    page.wait_for_selector("#system-properties")
    system = page.locator("#system-properties").inner_text()
    partition, local = decode_sequence_number(peeked.sequence_number)
    assert re.search(rf"Partition\s+{partition}\b", system)
    assert re.search(rf"Partition sequence number\s+{local}\b", system)
    assert "order-42" in system and "application/json" in system
    props = page.locator("#application-properties").inner_text()
    assert "region" in props and "west" in props and "priority" in props
    assert json.loads(page.locator("#body-json").inner_text()) == {"order": 42, "items": ["a", "b"]}
    assert "7b 22 6f 72" in page.locator("#body-hex").text_content()  # '{"or' (in a closed <details>)
    # a peek never locks: the SDK still receives it at once, first delivery; deferred, it shows as such
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            (got,) = receiver.receive_messages(max_wait_time=5)
            assert got.message_id == "order-42" and got.delivery_count == 0
            receiver.defer_message(got)
    page.goto(f"{base}/messages?path={q}&queue=deferred")
    assert "Deferred" in page.locator(f"#messages tr[data-seq='{peeked.sequence_number}']").inner_text()
    page.goto(f"{base}/messages?path={q}&queue=scheduled")
    assert page.locator("#messages tr[data-seq]").count() == 0


def test_resubmit_a_dead_letter(context, base, ns, conn_str, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("keep", message_id="keep"),
                    ServiceBusMessage("retry-me", message_id="retry-me", application_properties={"attempt": 1}),
                ]
            )
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            got = []
            while len(got) < 2:
                got += receiver.receive_messages(max_message_count=2, max_wait_time=5)
            for m in got:
                receiver.dead_letter_message(m, reason="Poison", error_description="bad amount")
    page = sign_in(context, base)
    page.goto(f"{base}/messages?path={q}&queue=deadletter")
    row = page.locator("#messages tr", has_text="retry-me")
    assert "Poison" in row.inner_text()
    row.locator("input[name=seq]").check()
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.click("#selection button[type=submit]")
    assert "Resubmitted 1 message" in page.locator(".note").inner_text()
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            (back,) = receiver.receive_messages(max_wait_time=5)
            assert str(back) == "retry-me" and back.message_id == "retry-me"
            assert back.application_properties[b"attempt"] == 1 and back.dead_letter_reason is None
            assert back.delivery_count == 0
            receiver.complete_message(back)
        with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            left = dlq.peek_messages(10)
    assert [m.message_id for m in left] == ["keep"]  # the other dead letter stayed, unlocked
    assert ns.get_runtime_properties(q).dead_letter_message_count == 1
    # and "resubmit all" from the entity page moves the rest
    page.goto(f"{base}/entity?path={q}")
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.click("form[action='/explorer/resubmit'] button[type=submit]")
    assert "Resubmitted 1 message" in page.locator(".note").inner_text()
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            (back,) = receiver.receive_messages(max_wait_time=5)
            assert back.message_id == "keep"
            receiver.complete_message(back)
    assert ns.get_runtime_properties(q).dead_letter_message_count == 0


def test_a_form_without_the_csrf_token_is_refused(context, base, ns, name):
    q = name("q")
    ns.create_queue(q)
    page = sign_in(context, base)
    page.goto(f"{base}/entity?path={q}")
    token = page.locator("#send-form input[name=csrf]").input_value()
    assert token
    form = {"path": q, "body": "forged"}
    assert context.request.post(f"{base}/send", form=form).status == 403
    assert context.request.post(f"{base}/send", form={**form, "csrf": token[:-2] + "xx"}).status == 403
    form = {"kind": "queue", "name": name("forged"), "confirmed": "yes"}
    assert context.request.post(f"{base}/delete", form={**form, "name": q}).status == 403
    assert ns.get_runtime_properties(q).active_message_count == 0 and ns.get_queue(q)
    # with the token but without the confirmation a purge or delete is refused too
    purge = {"path": q, "queue": "active", "csrf": token}
    assert context.request.post(f"{base}/purge", form=purge).status == 400
    assert context.request.post(f"{base}/delete", form={"kind": "queue", "name": q, "csrf": token}).status == 400
    assert ns.get_queue(q)
    assert context.request.post(f"{base}/send", form={"path": q, "body": "real", "csrf": token}).status == 200
    assert ns.get_runtime_properties(q).active_message_count == 1


def test_send_from_the_page_reaches_the_sdk(context, base, ns, conn_str, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    page = sign_in(context, base)
    page.goto(f"{base}/entity?path={q}")
    page.fill("#send-form textarea[name=body]", '{"hello": "world"}')
    page.fill("#send-form input[name=message_id]", "from-browser")
    page.fill("#send-form input[name=partition_key]", "pk-1")
    page.fill("#send-form textarea[name=properties]", "tenant=contoso\ncount=5")
    with page.expect_navigation():
        page.click("#send-form button[type=submit]")
    assert "Sent a message" in page.locator(".note").inner_text()
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            (got,) = receiver.receive_messages(max_wait_time=5)
            receiver.complete_message(got)
    assert str(got) == '{"hello": "world"}' and got.message_id == "from-browser" and got.partition_key == "pk-1"
    assert got.application_properties[b"tenant"] in (b"contoso", "contoso")
    assert got.application_properties[b"count"] == 5


def test_create_and_purge_with_confirmation(context, base, ns, name):
    q = name("q")
    page = sign_in(context, base)
    page.fill("form[action='/explorer/create'] input[name=name]", q)
    with page.expect_navigation():
        page.click("form[action='/explorer/create'] button[type=submit]")
    assert ns.get_queue(q).enable_partitioning
    for i in range(5):
        ns.send(q, Message(body=f"m{i}".encode()))
    page.goto(f"{base}/entity?path={q}")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("form[action='/explorer/purge'] button[type=submit]")
    time.sleep(0.3)
    assert ns.get_runtime_properties(q).active_message_count == 5  # dismissed: nothing happened
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.click("form[action='/explorer/purge'] button[type=submit]")
    assert "Purged 5 message" in page.locator(".note").inner_text()
    assert ns.get_runtime_properties(q).active_message_count == 0


def test_the_admin_api_still_owns_a_queue_named_explorer(broker, ns):
    from azure.servicebus.management import ServiceBusAdministrationClient

    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.ca_path), retry_total=0
    ) as admin:
        admin.create_queue("explorer")
        assert admin.get_queue("explorer").name == "explorer"
        admin.delete_queue("explorer")


@pytest.fixture
def ns(broker):
    return broker.namespace


def test_topic_rules_sessions_and_cancelling_a_scheduled_message(context, base, ns, conn_str, name):
    from datetime import UTC, datetime, timedelta

    from shardbus.model.filters import Rule, SqlFilter, SqlRuleAction

    t, sq = name("t"), name("sq")
    ns.create_topic(t, enable_partitioning=True)
    ns.create_subscription(t, "reds", default_rule=Rule("red", SqlFilter("color = 'red'"), SqlRuleAction("SET x = 1")))
    ns.create_queue(sq, requires_session=True)
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(sq) as sender:
            sender.send_messages([ServiceBusMessage("a", session_id="s-1"), ServiceBusMessage("b", session_id="s-2")])
        with client.get_queue_receiver(sq, session_id="s-1") as session_receiver:
            session_receiver.session.set_state("step-2")
        with client.get_topic_sender(t) as sender:
            (seq,) = sender.schedule_messages(
                ServiceBusMessage("later", application_properties={"color": "red"}),
                datetime.now(UTC) + timedelta(hours=1),
            )
    page = sign_in(context, base)
    page.goto(f"{base}/entity?path={t}")
    rules = page.locator("#subscriptions").inner_text()
    assert "reds" in rules and "color = 'red'" in rules and "SET x = 1" in rules
    page.goto(f"{base}/entity?path={sq}")
    sessions = page.locator("#sessions").inner_text()
    assert "s-1" in sessions and "s-2" in sessions and "step-2" in sessions
    # the scheduled message shows in its subscription; cancelling it there cancels it on the topic
    page.goto(f"{base}/messages?path={t}/Subscriptions/reds&queue=scheduled")
    row = page.locator(f"#messages tr[data-seq='{seq}']")
    assert "Scheduled" in row.inner_text()
    row.locator("input[name=seq]").check()
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.click("#selection button[type=submit]")
    assert "Cancelled 1 scheduled" in page.locator(".note").inner_text()
    assert ns.get_runtime_properties(f"{t}/Subscriptions/reds").scheduled_message_count == 0
