"""The one-table-per-concern modules of ``shardbus.model``: the error table, the duration parser."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shardbus.model import errors
from shardbus.model.durations import TIMESPAN_MAX_TEXT, format_duration, parse_duration
from shardbus.model.entities import TIMESPAN_MAX


def test_every_error_has_one_row_with_its_condition_and_status() -> None:
    assert set(errors.ALL_ERRORS) == set(errors.ERROR_TABLE)
    for cls, (condition, status) in errors.ERROR_TABLE.items():
        assert isinstance(condition, str) and ":" in condition, cls
        assert 400 <= status < 600, cls
        assert errors.error_mapping_of(cls("x")) == (condition, status)
        assert errors.http_status_of(cls("x")) == status
    assert errors.error_mapping_of(KeyError("x")) == ("amqp:internal-error", 500)


def test_a_subclass_outside_the_table_maps_as_its_nearest_base() -> None:
    class Mine(errors.ArgumentOutOfRange):
        pass

    assert errors.error_mapping_of(Mine("x")) == ("com.microsoft:argument-out-of-range", 400)
    assert errors.error_mapping_of(errors.PartitionFull("x")) == ("com.microsoft:server-busy", 503)


def test_the_amqp_front_end_reads_the_same_table() -> None:
    from shardbus.endpoint.conditions import condition_of

    for cls, (condition, status) in errors.ERROR_TABLE.items():
        symbol, code = condition_of(cls("x"))
        assert (str(symbol), code) == (condition, status)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PT45S", timedelta(seconds=45)),
        ("P1DT2H3M4.5S", timedelta(days=1, hours=2, minutes=3, seconds=4.5)),
        ("1.02:03:04.5", timedelta(days=1, hours=2, minutes=3, seconds=4.5)),  # the TimeSpan form
        ("-PT1M", timedelta(minutes=-1)),
        ("PT0.00000015S", timedelta(0)),  # below a tick: truncated, as .NET does
        (TIMESPAN_MAX_TEXT, TIMESPAN_MAX),
        ("10675199.02:48:05.4775807", TIMESPAN_MAX),
    ],
)
def test_durations_parse(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


def test_durations_format_back() -> None:
    for value in (timedelta(seconds=45), timedelta(days=1, microseconds=500), TIMESPAN_MAX, timedelta(0)):
        assert parse_duration(format_duration(value)) == value


@pytest.mark.parametrize("text", ["", "P", "PT", "30", "25:00:00", "P10675200D", None, 30])
def test_durations_refused_name_what(text: object) -> None:
    with pytest.raises(errors.ArgumentError, match=r"^LockDuration: "):
        parse_duration(text, "LockDuration")  # type: ignore[arg-type]


def test_the_stored_amqp_types_are_registered_by_a_call_not_an_import() -> None:
    import subprocess
    import sys

    script = (
        "from shardbus.store import records; import shardbus.store.amqp_values as m; "
        "print(len(records._registered)); m.register_stored_types(); m.register_stored_types(); "
        "print(len(records._registered))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    from shardbus.store.amqp_values import STORED_TYPES

    assert done.stdout.split() == ["0", str(len(STORED_TYPES))]


def test_the_client_and_the_endpoint_map_a_message_alike() -> None:
    """What the client encodes, the endpoint reads back field for field (both through ``message_wire``)."""
    import uuid

    from shardbus.amqp.message import decode_message
    from shardbus.client import OutgoingMessage
    from shardbus.endpoint.mapping import decode_to_message, to_message

    sent = OutgoingMessage(
        body=b"x",
        message_id="m",
        partition_key="pk",
        session_id="s",
        correlation_id=uuid.UUID(int=7),
        subject="subj",
        content_type="text/plain",
        to="to",
        reply_to="rt",
        reply_to_session_id="rts",
        time_to_live_ms=5000,
        application_properties={"a": 1},
    )
    payload = sent.encode()
    for got in (decode_to_message(payload), to_message(decode_message(payload))):
        for name in ("message_id", "session_id", "correlation_id", "subject", "content_type", "to", "reply_to"):
            assert getattr(got, name) == getattr(sent, name), name
        assert got.reply_to_session_id == "rts"
        assert got.partition_key == "pk"
        assert got.time_to_live == timedelta(seconds=5)
        assert got.application_properties == {"a": 1}
        assert got.body == b"x"


def test_properties_of_spells_out_the_property_fields_table() -> None:
    from shardbus.client import OutgoingMessage
    from shardbus.message_wire import PROPERTY_FIELDS, properties_of

    m = OutgoingMessage(**{name: f"v-{name}" for name, _field in PROPERTY_FIELDS})
    p = properties_of(m)
    assert {name: getattr(p, field) for name, field in PROPERTY_FIELDS} == {
        name: f"v-{name}" for name, _field in PROPERTY_FIELDS
    }


def test_read_properties_spells_out_the_property_fields_table() -> None:
    from shardbus.amqp.message import Properties
    from shardbus.client import OutgoingMessage
    from shardbus.message_wire import PROPERTY_FIELDS, read_properties

    p = Properties(**{field: f"v-{field}" for _name, field in PROPERTY_FIELDS})
    m = OutgoingMessage()
    read_properties(m, p)
    assert {name: getattr(m, name) for name, _field in PROPERTY_FIELDS} == {
        name: f"v-{field}" for name, field in PROPERTY_FIELDS
    }


# --- one rule translation: every form reads back what it (or the model) writes ---------------------------------


def _rules() -> list:
    from datetime import UTC, datetime

    from shardbus.model.filters import (
        CorrelationFilter,
        FalseFilter,
        Rule,
        SqlFilter,
        SqlRuleAction,
        TrueFilter,
    )

    return [
        Rule("t", TrueFilter()),
        Rule("f", FalseFilter(), SqlRuleAction("SET a = 1")),
        Rule("s", SqlFilter("color = @c", {"@c": "red", "@n": 3}), SqlRuleAction("SET b = @x", {"@x": 2.5})),
        Rule("c", CorrelationFilter(correlation_id="id", subject="label", content_type="ct", properties={"p": 1})),
        Rule("c2", CorrelationFilter(reply_to_session_id="r", properties={"when": datetime(2030, 1, 1, tzinfo=UTC)})),
    ]


@pytest.mark.parametrize("index", range(5))
def test_each_form_of_a_rule_reads_back_what_it_writes(index: int) -> None:
    from shardbus.endpoint import rules as amqp
    from shardbus.http import atom
    from shardbus.model.filters import Rule, filter_from_dict

    rule = _rules()[index]
    xml = f'<entry xmlns="{atom.ATOM_NS}"><content type="application/xml">{atom.rule_xml(rule, 0.0)}</content></entry>'
    assert atom.parse_rule(xml.encode(), rule.name) == rule
    assert amqp.decode_rule(amqp.encode_rule(rule)) == rule
    assert amqp.decode_rule(amqp.encode_rule_map(rule)) == rule
    assert Rule.from_dict(rule.to_dict()) == rule
    assert filter_from_dict(rule.filter.to_dict()).kind == rule.filter.kind


def test_the_forms_share_the_true_and_false_spelling_and_the_field_names() -> None:
    from shardbus.config import read_config
    from shardbus.model.filters import CORRELATION_FIELDS, FalseFilter, SqlFilter, TrueFilter, build_filter, sql_filter

    assert sql_filter(" 1 = 1 ") == TrueFilter() and sql_filter("1=0") == FalseFilter()
    assert isinstance(sql_filter("1=1", {"@a": 1}), SqlFilter)  # with parameters it is a SQL filter as written
    assert build_filter("sql", "1=1").kind == "sql"
    with pytest.raises(errors.ArgumentError):
        build_filter("mystery")
    correlation = {f.service: f"v{i}" for i, f in enumerate(CORRELATION_FIELDS)}
    config = read_config(
        {
            "UserConfig": {
                "Namespaces": [
                    {
                        "Name": "ns",
                        "Topics": [
                            {
                                "Name": "t",
                                "Subscriptions": [
                                    {
                                        "Name": "s",
                                        "Rules": [
                                            {
                                                "Name": "c",
                                                "Properties": {
                                                    "FilterType": "Correlation",
                                                    "CorrelationFilter": correlation,
                                                },
                                            },
                                            {
                                                "Name": "f",
                                                "Properties": {
                                                    "FilterType": "Sql",
                                                    "SqlFilter": {"SqlExpression": "1 = 0"},
                                                },
                                            },
                                        ],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        }
    )
    parsed = config.namespaces[0].topics[0].subscriptions[0].rules
    assert parsed[0].filter.fields() == {f.attr: f"v{i}" for i, f in enumerate(CORRELATION_FIELDS)}
    assert parsed[1].filter == FalseFilter()
