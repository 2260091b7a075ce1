"""Scalar values as the service's XML writes them: ISO-8601 durations, booleans, timestamps, typed rule values.

Parsing raises ``ArgumentError`` with the offending text, which the ATOM API answers with 400 and that reason.
"""

from __future__ import annotations

import base64
import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from ..model.entities import TIMESPAN_MAX
from ..model.errors import ArgumentError

XSD_NS = "http://www.w3.org/2001/XMLSchema"
INT32_MAX = 2**31 - 1
TIMESPAN_MAX_TEXT = "P10675199DT2H48M5.4775807S"  # .NET TimeSpan.MaxValue: the service's "never"

_DURATION = re.compile(
    r"(?P<sign>-)?P(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)(?:\.(?P<fraction>\d+))?S)?)?"
)


def parse_duration(text: str | None, what: str = "duration") -> timedelta:
    """``PT1M``, ``P1D``, ``P10675199DT2H48M5.4775807S`` (TimeSpan.MaxValue, kept as shardbus' TIMESPAN_MAX)."""
    raw = (text or "").strip()
    match = _DURATION.fullmatch(raw)
    if not match or raw in ("P", "-P") or raw.endswith("T"):
        raise ArgumentError(f"{what}: '{text}' is not an ISO-8601 duration such as PT30S or P1D.")
    parts = {k: int(v) for k, v in match.groupdict().items() if v and k not in ("sign", "fraction")}
    fraction = (match.group("fraction") or "")[:6].ljust(6, "0")
    days = parts.get("years", 0) * 365 + parts.get("months", 0) * 30 + parts.get("weeks", 0) * 7 + parts.get("days", 0)
    try:
        value = timedelta(
            days=days,
            hours=parts.get("hours", 0),
            minutes=parts.get("minutes", 0),
            seconds=parts.get("seconds", 0),
            microseconds=int(fraction),
        )
    except OverflowError:
        value = TIMESPAN_MAX
    if match.group("sign"):
        value = -value
    return min(value, TIMESPAN_MAX)


def format_duration(value: timedelta) -> str:
    """A timedelta as .NET's XmlConvert writes a TimeSpan: ``PT45S``, ``P1D``, ``P1DT2H3M4.5S``."""
    if value >= TIMESPAN_MAX:
        return TIMESPAN_MAX_TEXT
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    days, rest = value.days, value.seconds
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    out = f"{sign}P"
    if days:
        out += f"{days}D"
    time = ""
    if hours:
        time += f"{hours}H"
    if minutes:
        time += f"{minutes}M"
    if seconds or value.microseconds:
        frac = f".{value.microseconds:06d}".rstrip("0") if value.microseconds else ""
        time += f"{seconds}{frac}S"
    if time:
        out += "T" + time
    elif not days:
        out += "T0S"
    return out


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
