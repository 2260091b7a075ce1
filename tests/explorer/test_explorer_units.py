"""The explorer's pure parts: the session cookie and CSRF token, the rate history, the charts, form parsing."""

from __future__ import annotations

import dataclasses
import time

import pytest

from shardbus.access.directory import NamespaceDirectory
from shardbus.http.explorer import actions, charts, history, signin
from shardbus.http.protocol import HttpRequest
from shardbus.model.authorization import AuthorizationRule
from shardbus.model.errors import ArgumentError, Unauthorized
from shardbus.model.message import Message

KEYS = {"RootManageSharedAccessKey": "k1"}


@pytest.fixture
def directory(ns):
    return NamespaceDirectory({ns.name: ns}, ns.name, {ns.name: dict(KEYS)})


def request(cookie: str | None) -> HttpRequest:
    headers = {"host": "localhost:5672"}
    if cookie is not None:
        headers["cookie"] = f"other=1; {signin.COOKIE}={cookie}"
    return HttpRequest("GET", "/explorer", headers, b"", "http")


def test_sign_in_checks_the_key_and_the_cookie_carries_no_key(directory, ns):
    with pytest.raises(Unauthorized, match="invalid signature"):
        signin.sign_in(directory, "localhost", key_name="RootManageSharedAccessKey", key="wrong")
    with pytest.raises(Unauthorized, match="not known"):
        signin.sign_in(directory, "localhost", key_name="nobody", key="k1")
    cookie, session = signin.sign_in(directory, "localhost", key_name="RootManageSharedAccessKey", key="k1")
    assert "k1" not in cookie and session.namespace is ns
    again = signin.session_of(directory, request(cookie))
    assert again.csrf == session.csrf and again.key_name == "RootManageSharedAccessKey"
    conn = "Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=k1"
    assert signin.sign_in(directory, "elsewhere", connection_string=conn)[1].namespace is ns


def test_sessions_expire_and_die_with_the_key(directory):
    now = time.time()
    cookie, _ = signin.sign_in(directory, "localhost", key_name="RootManageSharedAccessKey", key="k1", now=now)
    signin.session_of(directory, request(cookie), now=now + signin.SESSION_SECONDS - 10)
    with pytest.raises(Unauthorized, match="expired"):
        signin.session_of(directory, request(cookie), now=now + signin.SESSION_SECONDS + 1)
    with pytest.raises(Unauthorized):
        signin.session_of(directory, request(None))
    with pytest.raises(Unauthorized):
        signin.session_of(directory, request("garbage"))
    authority = next(iter(directory.authorities.values()))
    rule = authority.rules["RootManageSharedAccessKey"]
    authority.rules[rule.key_name] = dataclasses.replace(rule, primary_key="rotated")
    with pytest.raises(Unauthorized, match="invalid signature"):
        signin.session_of(directory, request(cookie))


def test_a_rule_without_manage_cannot_sign_in(ns):
    rules = [
        AuthorizationRule("RootManageSharedAccessKey", "k1", "", ("Manage", "Send", "Listen")),
        AuthorizationRule("reader", "r1", "", ("Listen",)),
    ]
    directory = NamespaceDirectory({ns.name: ns}, ns.name, {ns.name: rules})
    with pytest.raises(Unauthorized, match="needs a namespace rule with Manage rights; 'reader' has Listen"):
        signin.sign_in(directory, "localhost", key_name="reader", key="r1")
    signin.sign_in(directory, "localhost", key_name="RootManageSharedAccessKey", key="k1")


def test_csrf_tokens_belong_to_their_session(directory):
    _a, session_a = signin.sign_in(directory, "localhost", key_name="RootManageSharedAccessKey", key="k1")
    _, session_b = signin.sign_in(
        directory, "localhost", key_name="RootManageSharedAccessKey", key="k1", now=time.time() + 5
    )
    assert session_a.csrf != session_b.csrf
    signin.check_csrf(session_a, session_a.csrf)
    for bad in (None, "", session_b.csrf):
        with pytest.raises(signin.Forbidden):
            signin.check_csrf(session_a, bad)


def test_cookie_attributes():
    plain, secure = signin.session_cookie("v", secure=False), signin.session_cookie("v", secure=True)
    for cookie in (plain, secure):
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/explorer" in cookie
        assert "Max-Age=" in cookie
    assert "Secure" not in plain and secure.endswith("; Secure")
    assert "Max-Age=0" in signin.cleared_cookie(True)


def test_rates_from_counter_samples_are_bounded():
    now = [0.0]
    h = history.RateHistory(clock=lambda: now[0])
    assert h.record(("ns", "q"), [(0, 0), (0, 0)])[0].incoming == []
    now[0] = 2.0
    rates = h.record(("ns", "q"), [(10, 4), (0, 0)])
    assert rates[0].incoming == [5.0] and rates[0].outgoing == [2.0] and rates[1].incoming_now == 0.0
    now[0] = 3.0  # too soon after the last sample: not recorded
    assert len(h.record(("ns", "q"), [(99, 99), (0, 0)])[0].incoming) == 1
    now[0] = 5.0  # a restarted partition's counter went down: zero, not negative
    assert h.record(("ns", "q"), [(3, 4), (0, 0)])[0].incoming[-1] == 0.0
    for i in range(3 * history.SAMPLES):
        now[0] = 10.0 + i * history.MIN_SPACING
        rates = h.record(("ns", "q"), [(i, i), (0, 0)])
    assert len(rates[0].incoming) <= history.SAMPLES - 1
    for i in range(history.ENTITIES + 10):
        h.record(("ns", f"e{i}"), [(0, 0)])
    assert len(h._samples) == history.ENTITIES
    assert len(h.record(("ns", "q"), [(1, 1)] * 3)) == 3  # partition count changed: starts over


def test_charts_are_svg_and_escape_their_text():
    strip = str(charts.heat_strip([0, 5, None, 10], labels=["a", "<b>", "down", "d"]))
    assert strip.startswith("<svg") and strip.count("<rect") == 4 and "data-down" in strip
    assert "<b>" not in strip and "&lt;b&gt;" in strip
    assert "polyline" in str(charts.sparkline([0.0, 1.0, 3.0]))
    assert "polyline" not in str(charts.sparkline([1.0]))


def test_form_values():
    assert actions.parse_properties('a=1\nb = x\n\nc=true\nd="007"') == {"a": 1, "b": "x", "c": True, "d": "007"}
    with pytest.raises(ArgumentError):
        actions.parse_properties("novalue")
    assert actions.parse_time("2030-01-02T03:04").tzinfo is not None
    with pytest.raises(ArgumentError):
        actions.parse_time("tomorrow")


def test_a_resubmission_is_a_new_message():
    m = Message(body=b"x", message_id="m1", session_id="s", application_properties={"a": 1, "DeadLetterReason": "r"})
    m.sequence_number, m.delivery_count, m.dead_letter_reason, m.enqueued_time_ms = 77, 5, "r", 1
    fresh = actions.resubmission(m)
    assert fresh.body == b"x" and fresh.message_id == "m1" and fresh.session_id == "s"
    assert fresh.application_properties == {"a": 1}
    assert fresh.sequence_number is None and fresh.delivery_count == 0 and fresh.dead_letter_reason is None
    assert fresh.enqueued_time_ms is None
