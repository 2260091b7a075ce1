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
        "from shardbus.store import records; import shardbus.endpoint.mapping as m; "
        "print(len(records._registered)); m.register_stored_types(); m.register_stored_types(); "
        "print(len(records._registered))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    from shardbus.endpoint.mapping import STORED_TYPES

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
