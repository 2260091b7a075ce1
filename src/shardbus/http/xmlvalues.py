"""Scalar values as the service's XML writes them: durations (``model.durations``), booleans, timestamps, typed rule
values.

Parsing raises ``ArgumentError`` with the offending text, which the ATOM API answers with 400 and that reason.
"""

from __future__ import annotations

import base64
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from ..model.durations import TIMESPAN_MAX_TEXT, format_duration, parse_duration
from ..model.errors import ArgumentError

__all__ = [
    "INT32_MAX",
    "TIMESPAN_MAX_TEXT",
    "XSD_NS",
    "format_bool",
    "format_duration",
    "format_timestamp",
    "format_typed_value",
    "parse_bool",
    "parse_datetime",
    "parse_duration",
    "parse_int",
    "parse_typed_value",
]

XSD_NS = "http://www.w3.org/2001/XMLSchema"
INT32_MAX = 2**31 - 1


def parse_bool(text: str | None, what: str = "value") -> bool:
    value = (text or "").strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise ArgumentError(f"{what}: '{text}' is not a boolean (true or false).")


def format_bool(value: bool) -> str:
    return "true" if value else "false"


def parse_int(text: str | None, what: str = "value") -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        raise ArgumentError(f"{what}: '{text}' is not an integer.") from None


def parse_datetime(text: str | None, what: str = "value") -> datetime:
    try:  # .NET's 7 fractional digits and a "Z" suffix are fine for fromisoformat (Python 3.11+)
        value = datetime.fromisoformat((text or "").strip())
    except ValueError:
        raise ArgumentError(f"{what}: '{text}' is not an ISO-8601 timestamp.") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def format_timestamp(seconds: float) -> str:
    """Unix seconds as the service writes timestamps: ``2026-01-02T03:04:05.1234567Z``."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0Z"


# --- typed values of rule parameters and correlation properties (xsi:type="d6p1:<type>") --------------------
def _parse_float(text: str) -> float:
    mapped = {"INF": "inf", "-INF": "-inf", "NaN": "nan"}
    return float(mapped.get(text.strip(), text))


_VALUE_PARSERS: dict[str, Any] = {
    "string": str,
    "int": int,
    "long": int,
    "short": int,
    "byte": int,
    "unsignedByte": int,
    "unsignedShort": int,
    "unsignedInt": int,
    "unsignedLong": int,
    "double": _parse_float,
    "float": _parse_float,
    "decimal": _parse_float,
    "boolean": lambda t: parse_bool(t, "boolean rule value"),
    "dateTime": lambda t: parse_datetime(t, "dateTime rule value"),
    "duration": lambda t: parse_duration(t, "duration rule value"),
    "guid": uuid.UUID,
    "base64Binary": base64.b64decode,
}


def parse_typed_value(type_name: str | None, text: str | None) -> Any:
    """A rule value from its ``xsi:type`` (prefix ignored) and text; an unknown type keeps the text."""
    local = (type_name or "string").rsplit(":", 1)[-1]
    parser = _VALUE_PARSERS.get(local, str)
    try:
        return parser(text or "")
    except (ValueError, TypeError):
        raise ArgumentError(f"Rule value '{text}' is not a valid {local}.") from None


def format_typed_value(value: Any) -> tuple[str, str]:
    """(xsd type name, text) for a rule value, the way the SDK and the service write them."""
    if isinstance(value, bool):
        return "boolean", format_bool(value)
    if isinstance(value, int):
        return ("int" if -INT32_MAX - 1 <= value <= INT32_MAX else "long"), str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "double", "NaN"
        if math.isinf(value):
            return "double", "INF" if value > 0 else "-INF"
        return "double", repr(value)
    if isinstance(value, datetime):
        return "dateTime", value.isoformat()
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    if isinstance(value, bytes):
        return "base64Binary", base64.b64encode(value).decode("ascii")
    return "string", "" if value is None else str(value)
