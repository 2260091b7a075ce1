"""``shardbus`` subcommands end to end against a running broker: entity management over HTTPS, messages over
AMQP, plain and ``--json`` output, errors (a clear message and a non-zero exit), and JSON-lines round trips."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shardbus.cli import main as cli_main
from shardbus.model.routing import decode_sequence_number

# --------------------------------------------------------------------------------------------- queues


def test_queue_create_list_show_update_delete(cli, name):
    q = name("q")
    created = cli.json(
        "queue", "create", q, "--enable-partitioning", "--lock-duration", "30s", "--max-delivery-count", "7"
    )
    assert created["name"] == q and created["enable_partitioning"] is True and created["lock_duration"] == "PT30S"

    listed = {item["name"]: item for item in cli.json("queue", "list")}
    assert listed[q]["active_message_count"] == 0 and listed[q]["enable_partitioning"] is True

    plain = cli("queue", "list").stdout
    assert plain.splitlines()[0].split()[:2] == ["NAME", "PARTITIONED"]
    assert any(line.split()[0] == q for line in plain.splitlines()[1:])

    shown = cli.json("queue", "show", q)
    assert shown["max_delivery_count"] == 7 and shown["availability_status"] == "Available"
    assert "lock_duration" in cli("queue", "show", q).stdout

    updated = cli.json("queue", "update", q, "--max-delivery-count", "3", "--user-metadata", "hello")
    # an update changes what was given and keeps the rest (the service would reset what is left out)
    assert updated["max_delivery_count"] == 3 and updated["lock_duration"] == "PT30S"
    assert updated["user_metadata"] == "hello" and updated["enable_partitioning"] is True

    refused = cli("queue", "update", q, "--no-enable-partitioning", ok=False)
    assert refused.exit_code == 1 and "'enable_partitioning' property of an existing queue" in refused.stderr

    again = cli("queue", "create", q, ok=False)
    assert "already exists" in again.stderr

    assert "--yes" in cli("queue", "delete", q, ok=False).stderr  # no prompt without a terminal: --yes needed
    assert cli.json("queue", "delete", q, "--yes") == {"deleted": q, "kind": "queue"}
    gone = cli("queue", "show", q, ok=False)
    assert gone.exit_code == 1 and f"queue '{q}' does not exist" in gone.stderr


def test_update_keeps_authorization_rules(cli, name, broker):
    """Rules set through the admin client survive a CLI update (which re-sends the whole description) and show."""
    from shardbus.model.authorization import AuthorizationRule

    q = name("q")
    broker.namespace.create_queue(q, authorization_rules=[AuthorizationRule("app", "a2V5", "", ("Send",))])
    cli.json("queue", "update", q, "--max-delivery-count", "3")
    (rule,) = broker.namespace.get_queue(q).authorization_rules
    assert (rule.key_name, rule.primary_key, rule.rights) == ("app", "a2V5", ("Send",))
    shown = cli.json("queue", "show", q)
    assert [(r["key_name"], r["rights"]) for r in shown["authorization_rules"]] == [("app", ["Send"])]


def test_queue_option_values_are_checked(cli, name):
    bad = cli("queue", "create", name("q"), "--lock-duration", "soon", ok=False)
    assert bad.exit_code == 2 and "not a duration" in bad.stderr
    out_of_range = cli("queue", "create", name("q"), "--lock-duration", "1h", ok=False)
    assert out_of_range.exit_code == 1 and "LockDuration" in out_of_range.stderr
    assert cli("queue", "update", name("q"), ok=False).exit_code == 2  # nothing to change


def test_topic_subscription_and_rule_commands(cli, name):
    t = name("t")
    assert cli.json("topic", "create", t, "--enable-partitioning")["enable_partitioning"] is True
    assert t in [item["name"] for item in cli.json("topic", "list")]
    sub = cli.json("subscription", "create", t, "alerts", "--max-delivery-count", "3", "--default-filter", "sev > 3")
    assert sub["name"] == "alerts" and sub["max_delivery_count"] == 3
    cli("subscription", "create", t, "all")
    assert [s["name"] for s in cli.json("subscription", "list", t)] == ["alerts", "all"]
    assert cli.json("subscription", "show", t, "all")["lock_duration"] == "PT1M"
    assert cli.json("subscription", "update", t, "all", "--lock-duration", "45s")["lock_duration"] == "PT45S"
    assert cli.json("topic", "show", t)["subscription_count"] == 2
    assert cli.json("topic", "update", t, "--user-metadata", "m")["user_metadata"] == "m"

    rule = cli.json("rule", "create", t, "alerts", "high", "--sql", "sev > @min", "--param", "@min=5",
                    "--action", "SET tagged = 1")  # fmt: skip
    assert rule["filter_definition"] == {"type": "sql", "expression": "sev > @min", "parameters": {"@min": 5}}
    assert rule["action"] == "sql: SET tagged = 1"
    cli("rule", "create", t, "alerts", "eu", "--subject", "order", "--property", "region=eu")
    rules = {r["name"]: r for r in cli.json("rule", "list", t, "alerts")}
    assert set(rules) == {"$Default", "high", "eu"}
    assert rules["$Default"]["filter"] == "sql: sev > 3"
    assert rules["eu"]["filter"] == "correlation: subject=order, region=eu"
    assert "correlation: subject=order" in cli("rule", "list", t, "alerts").stdout
    assert cli.json("rule", "update", t, "alerts", "high", "--false")["filter"] == "false"
    assert cli.json("rule", "show", t, "alerts", "high")["filter_definition"] == {"type": "false"}
    cli("rule", "delete", t, "alerts", "eu")

    missing = cli("rule", "show", t, "alerts", "eu", ok=False)
    assert missing.exit_code == 1 and "has no rule 'eu'" in missing.stderr
    assert "has no subscription 'nope'" in cli("rule", "list", t, "nope", ok=False).stderr
    assert "--sql" in cli("rule", "create", t, "alerts", "bad", "--sql", "sev >>", ok=False).stderr
    assert "one filter" in cli("rule", "create", t, "alerts", "two", "--true", "--false", ok=False).stderr

    assert "is a topic, not a queue" in cli("queue", "show", t, ok=False).stderr
    assert "is a topic, not a queue" in cli("queue", "delete", t, "--yes", ok=False).stderr
    cli("subscription", "delete", t, "all", "--yes")
    assert "has no subscription 'all'" in cli("subscription", "show", t, "all", ok=False).stderr
    cli("topic", "delete", t, "--yes")
    assert "does not exist" in cli("topic", "show", t, ok=False).stderr


# ------------------------------------------------------------------------------------------- messages


def test_send_from_arguments_stdin_and_file_then_peek(cli, name, tmp_path):
    q = name("q")
    cli("queue", "create", q, "--enable-partitioning")
    sent = cli.json("send", q, "hello", "world", "--partition-key", "k1", "--subject", "greeting", "-p", "prio=3")
    assert sent == {"entity": q, "sent": 2}
    lines = [
        {"body": "a", "message_id": "m1", "application_properties": {"x": 1, "flag": True}},
        {"body": {"j": 2}, "session_id": None, "partition_key": "p2", "time_to_live": 60},
    ]
    stdin = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    assert "sent 2 message(s)" in cli("send", q, input=stdin).stdout
    text_file = tmp_path / "lines.txt"
    text_file.write_text("line1\nline2\n")
    cli("send", q, "--file", str(text_file), "--format", "text")

    peeked = cli.json("peek", q, "--count", "100")
    assert len(peeked) == 6
    by_body = {m["body"]: m for m in peeked}
    assert by_body["hello"]["partition_key"] == "k1" and by_body["hello"]["subject"] == "greeting"
    assert by_body["hello"]["application_properties"] == {"prio": 3}
    assert by_body["a"]["message_id"] == "m1" and by_body["a"]["application_properties"] == {"x": 1, "flag": True}
    assert by_body['{"j": 2}']["content_type"] == "application/json"
    assert by_body['{"j": 2}']["time_to_live"] == 60
    for m in peeked:
        assert m["partition"] == decode_sequence_number(m["sequence_number"])[0]
        assert m["state"] == "active" and m["delivery_count"] == 0
    # peek walks partition by partition, in sequence order
    assert [m["sequence_number"] for m in peeked] == sorted(m["sequence_number"] for m in peeked)
    assert len(cli.json("peek", q, "-n", "2")) == 2

    table = cli("peek", q).stdout
    assert "SEQ" in table.splitlines()[1] and "hello" in table

    bad = cli("send", q, input='{"body": "ok"}\nnot json\n', ok=False)
    assert bad.exit_code == 1 and "<stdin>:2: not JSON" in bad.stderr
    unknown = cli("send", q, input='{"bodyy": "typo"}\n', ok=False)
    assert "unknown field(s) bodyy" in unknown.stderr


def test_receive_modes_and_settlement(cli, name):
    q = name("q")
    cli("queue", "create", q, "--enable-partitioning", "--max-delivery-count", "5")
    cli("send", q, *[f"m{i}" for i in range(6)])

    released = cli.json("receive", q, "-n", "2", "--settle", "release")
    assert len(released) == 2 and all("lock_token" in m for m in released)
    abandoned = cli.json("receive", q, "-n", "6", "--settle", "abandon")
    assert len(abandoned) == 6
    after = cli.json("peek", q, "-n", "10")
    assert sorted(m["delivery_count"] for m in after) == [1] * 6  # release does not count, abandon does

    completed = cli.json("receive", q, "-n", "2")
    assert len(completed) == 2
    assert cli.json("queue", "show", q)["active_message_count"] == 4
    deleted = cli.json("receive", q, "-n", "3", "--receive-and-delete")
    assert len(deleted) == 3 and all("lock_token" not in m for m in deleted)
    assert cli.json("queue", "show", q)["active_message_count"] == 1

    plain = cli("receive", q, "-n", "5", "--max-wait", "1").stdout
    assert "BODY" in plain and len(plain.strip().splitlines()) == 3  # title, header, one message
    empty = cli("receive", q, "--max-wait", "0.2")
    assert "no messages" in empty.stderr
    assert cli.json("receive", q, "--max-wait", "0.2") == []


def test_receive_from_sessions(cli, name):
    q = name("q")
    cli("queue", "create", q, "--enable-partitioning", "--requires-session")
    cli("send", q, "a", "b", "--session-id", "s1")
    cli("send", q, "c", "--session-id", "s2")
    assert "SessionId was not set" in cli("send", q, "no session", ok=False).stderr
    assert [m["body"] for m in cli.json("receive", q, "--session-id", "s2", "-n", "5")] == ["c"]
    first = cli.json("receive", q, "-n", "5")  # the next available session: all of its messages, in order
    assert [m["body"] for m in first] == ["a", "b"] and {m["session_id"] for m in first} == {"s1"}
    none_left = cli("receive", q, "--max-wait", "0.5", ok=False)
    assert none_left.exit_code == 1 and "no session with messages" in none_left.stderr
    assert "not session-enabled" in cli("receive", q, "--dead-letter", "--session-id", "s1", ok=False).stderr


def test_dead_letter_resubmit_and_purge(cli, name):
    q = name("q")
    cli("queue", "create", q, "--enable-partitioning")
    cli("send", q, "a", "b", "c", "d", "-p", "n=1")
    dead = cli.json("receive", q, "-n", "3", "--settle", "dead-letter", "--reason", "Broken")
    assert len(dead) == 3
    letters = cli.json("peek", q, "--dead-letter")
    assert len(letters) == 3 and {m["dead_letter_reason"] for m in letters} == {"Broken"}
    assert all(m["application_properties"] == {"n": 1} for m in letters)  # the reason is not a user property
    assert "DEAD-LETTER REASON" in cli("peek", q, "--dead-letter").stdout

    one = cli.json("dead-letter", "resubmit", q, "--count", "1")
    assert one == {"from": f"{q}/$DeadLetterQueue", "to": q, "resubmitted": 1}
    assert cli.json("dead-letter", "resubmit", q)["resubmitted"] == 2
    assert cli.json("peek", q, "--dead-letter") == []
    back = cli.json("peek", q, "-n", "10")
    assert sorted(m["body"] for m in back) == ["a", "b", "c", "d"]
    assert all("dead_letter_reason" not in m and m["application_properties"] == {"n": 1} for m in back)

    cli("receive", q, "-n", "1", "--settle", "dead-letter")
    assert "pass --yes" in cli("purge", q, ok=False).stderr
    assert cli.json("purge", q, "--yes") == {"entity": q, "purged": 3, "unavailable_partitions": []}
    assert cli.json("peek", q) == []
    assert cli.json("purge", q, "--dead-letter", "--yes")["purged"] == 1
    counts = cli.json("queue", "show", q)
    assert counts["active_message_count"] == 0 and counts["dead_letter_message_count"] == 0
    assert "purged 0 message(s)" in cli("purge", q, "-y").stdout


def test_subscription_messages(cli, name):
    t = name("t")
    cli("topic", "create", t, "--enable-partitioning")
    cli("subscription", "create", t, "high", "--default-filter", "sev > 3")
    cli("subscription", "create", t, "all")
    cli("send", t, "low", "-p", "sev=1")
    cli("send", t, "urgent", "-p", "sev=9")
    assert [m["body"] for m in cli.json("peek", t, "-s", "high")] == ["urgent"]
    assert sorted(m["body"] for m in cli.json("peek", f"{t}/Subscriptions/all")) == ["low", "urgent"]

    assert [m["body"] for m in cli.json("receive", t, "-s", "high", "--settle", "dead-letter")] == ["urgent"]
    resubmitted = cli.json("dead-letter", "resubmit", t, "-s", "high")
    assert resubmitted["to"] == t and resubmitted["resubmitted"] == 1
    assert [m["body"] for m in cli.json("peek", t, "-s", "high")] == ["urgent"]  # back through the topic
    assert len(cli.json("peek", t, "-s", "all")) == 3  # ... so every matching subscription got a copy

    topic_itself = cli("peek", t, ok=False)
    assert (
        topic_itself.exit_code == 1 and "is a topic" in topic_itself.stderr and "--subscription" in topic_itself.stderr
    )
    assert "not to a subscription" in cli("send", f"{t}/Subscriptions/all", "x", ok=False).stderr


def test_stats_per_partition(cli, name, broker):
    q = name("q")
    cli("queue", "create", q, "--enable-partitioning")
    cli("send", q, "a", "b", "--partition-key", "one")
    cli("send", q, "c", "--partition-key", "two")
    cli("receive", q, "-n", "1", "--settle", "dead-letter")
    [entity] = cli.json("stats", q)
    assert entity["entity"] == q and entity["kind"] == "queue" and entity["availability"] == "Available"
    assert entity["active_message_count"] == 2 and entity["dead_letter_message_count"] == 1
    rows = entity["partitions"]
    assert [r["partition"] for r in rows] == list(range(16))
    assert sum(r["depth"] for r in rows) == 2 and sum(r["dead_letters"] for r in rows) == 1
    assert all(r["health"] == "healthy" for r in rows)
    for r in rows:
        if r["depth"]:
            assert 0 <= r["oldest_age_seconds"] < 60
        else:
            assert r["oldest_age_seconds"] is None

    t = name("t")
    cli("topic", "create", t)
    cli("subscription", "create", t, "s1")
    cli("subscription", "create", t, "s2")
    by_topic = cli.json("stats", t)
    assert [e["entity"] for e in by_topic] == [f"{t}/Subscriptions/s1", f"{t}/Subscriptions/s2"]
    assert len(by_topic[0]["partitions"]) == 1  # not partitioned: one partition
    everything = {e["entity"] for e in cli.json("stats")}
    assert {q, f"{t}/Subscriptions/s1"} <= everything

    busy = next(r["partition"] for r in rows if r["depth"])
    broker.namespace.faults.stop_partition(q, busy)
    try:
        [limited] = cli.json("stats", q)
        row = limited["partitions"][busy]
        assert row["health"] == "DOWN" and row["depth"] is None and limited["availability"] == "Limited"
        plain = cli("stats", q).stdout
        assert "Limited" in plain.splitlines()[0] and "DOWN" in plain
    finally:
        broker.namespace.faults.restore_partition(q, busy)
    plain = cli("stats", q).stdout.splitlines()
    assert plain[1].split() == ["PARTITION", "DEPTH", "OLDEST", "DEAD", "LETTERS", "HEALTH"]
    assert len(plain) == 2 + 16
    assert "no queue or topic named 'nope'" in cli("stats", "nope", ok=False).stderr


def test_export_import_round_trip(cli, name, tmp_path):
    source, copy = name("q"), name("q")
    cli("queue", "create", source, "--enable-partitioning")
    cli("queue", "create", copy, "--enable-partitioning")
    records = [
        {"body": "plain text", "message_id": "id-1", "subject": "s", "correlation_id": "c", "to": "x",
         "content_type": "text/plain", "reply_to": "r",
         "application_properties": {"int": 1, "float": 2.5, "text": "t", "yes": True}},
        {"body_base64": "AAEC/w==", "partition_key": "pk", "time_to_live": 3600},
        {"body": "in a session", "session_id": "s-1", "reply_to_session_id": "s-2"},
    ] + [{"body": f"bulk {i}", "message_id": f"b{i}"} for i in range(40)]  # fmt: skip
    source_file = tmp_path / "in.jsonl"
    source_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.json("import", source, str(source_file)) == {"entity": source, "imported": 43}

    exported = tmp_path / "out.jsonl"
    done = cli.json("export", source, "-o", str(exported))
    assert done == {"entity": source, "exported": 43}
    first = [json.loads(line) for line in exported.read_text().splitlines()]
    cli("import", copy, str(exported))
    second = [json.loads(line) for line in cli("export", copy).stdout.splitlines()]
    assert "exported 43 message(s)" in cli("export", copy).stderr

    def sender_view(items):
        drop = {"sequence_number", "partition", "enqueued_time", "delivery_count", "state"}
        return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in items)

    assert sender_view(first) == sender_view(second)
    expected = {json.dumps(r, sort_keys=True) for r in records}
    assert set(sender_view(first)) == expected  # every field a sender set survives export and import
    assert cli.json("queue", "show", source)["active_message_count"] == 43  # export removes nothing

    dl = tmp_path / "dead.jsonl"
    cli("receive", source, "-n", "2", "--settle", "dead-letter", "--reason", "R")
    cli("export", source, "--dead-letter", "-o", str(dl))
    dead = [json.loads(line) for line in dl.read_text().splitlines()]
    assert len(dead) == 2 and all(r["dead_letter_reason"] == "R" for r in dead)

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"body": "fine"}\n["not", "an", "object"]\n')
    result = cli("import", copy, str(broken), ok=False)
    assert result.exit_code == 1 and "broken.jsonl:2: expected a JSON object" in result.stderr
    assert "no such file" in cli("import", copy, str(tmp_path / "missing.jsonl"), ok=False).stderr


# --------------------------------------------------------------------------------------------- errors


def test_missing_entities_are_named(cli, name):
    missing = name("nope")
    for args in (
        ("send", missing, "x"),
        ("peek", missing),
        ("receive", missing),
        ("purge", missing, "--yes"),
        ("export", missing),
        ("dead-letter", "resubmit", missing),
        ("stats", missing),
    ):
        result = cli(*args, ok=False)
        assert result.exit_code == 1, args
        assert result.stderr.strip() == f"error: no queue or topic named '{missing}'", args
    sub = cli("peek", "t-missing", "-s", "s", ok=False)
    assert "topic 't-missing' has no subscription 's'" in sub.stderr


def test_connection_errors(cli, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    unreachable = cli.connection_string.replace(
        cli.connection_string.split(";")[0], f"Endpoint=sb://localhost:{closed_port}"
    )
    result = cli.runner.invoke(cli_app(), ["--connection-string", unreachable, "queue", "list"])
    assert result.exit_code == 1 and "cannot reach the broker" in result.stderr
    result = cli.runner.invoke(cli_app(), ["--connection-string", unreachable, "peek", "q"])
    assert result.exit_code == 1 and "cannot reach the broker" in result.stderr

    untrusted = cli.runner.invoke(cli_app(), ["--connection-string", cli.connection_string, "queue", "list"])
    assert untrusted.exit_code == 1 and "--ca" in untrusted.stderr and "certificate" in untrusted.stderr

    wrong_key = cli.connection_string.replace("SAS_KEY_VALUE", "wrong")
    result = cli.runner.invoke(cli_app(), ["--connection-string", wrong_key, "--ca", cli.ca, "queue", "list"])
    assert result.exit_code == 1 and "refused the credentials" in result.stderr

    bad = cli.runner.invoke(cli_app(), ["--connection-string", "Endpoint=sb://x", "queue", "list"])
    assert bad.exit_code == 1 and "bad connection string" in bad.stderr
    no_ca = cli.runner.invoke(cli_app(), ["--ca", str(tmp_path / "none.pem"), "queue", "list"])
    assert no_ca.exit_code == 1 and "no such file" in no_ca.stderr


def cli_app():
    from shardbus.cli_commands import app

    return app


def test_options_after_the_subcommand_and_from_the_environment(cli, name):
    q = name("q")
    runner = cli.runner
    result = runner.invoke(
        cli_app(), ["queue", "create", q, "--connection-string", cli.connection_string, "--ca", cli.ca, "--json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["name"] == q
    env = {"SHARDBUS_CONNECTION_STRING": cli.connection_string, "SHARDBUS_CA": cli.ca}
    result = runner.invoke(cli_app(), ["--json", "queue", "show", q], env=env)
    assert result.exit_code == 0 and json.loads(result.stdout)["name"] == q


def test_the_console_entry_point(cli, name):
    """``main`` (the ``shardbus`` script) runs the commands and returns their exit status; serve is untouched."""
    missing = name("nope")
    args = ["--connection-string", cli.connection_string, "--ca", cli.ca]
    assert cli_main([*args, "queue", "show", missing]) == 1
    assert cli_main([*args, "queue", "list"]) == 0
    out = subprocess.run(
        [sys.executable, "-m", "shardbus.cli", *args, "peek", missing], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and f"no queue or topic named '{missing}'" in out.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "shardbus.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    for command in ("serve", "queue", "topic", "subscription", "rule", "send", "peek", "receive", "purge",
                    "dead-letter", "stats", "export", "import"):  # fmt: skip
        assert command in listed.stdout


@pytest.mark.parametrize("json_flag", [False, True])
def test_output_is_plain_without_a_terminal(cli, name, json_flag):
    q = name("q")
    cli("queue", "create", q)
    result = cli("queue", "show", q, *(["--json"] if json_flag else []))
    assert "\x1b[" not in result.stdout and "┃" not in result.stdout  # no colors or box drawing in a pipe
    if json_flag:
        assert json.loads(result.stdout)["name"] == q
    else:
        assert result.stdout.splitlines()[1].split() == ["name", q]
