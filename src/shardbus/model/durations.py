"""Durations as text, both ways: the one parser and formatter of ISO 8601 durations and .NET TimeSpan strings.

Config.json, the ATOM API's XML, typed rule values and the CLI all read durations here. Two forms occur:

* ISO 8601 (``PT1M``, ``P1D``, ``P1DT2H30M``, ``PT0.5S``), what the emulator documents and what the SDK and the
  service write in XML. Years count 365 days and months 30, as .NET's ``XmlConvert.ToTimeSpan`` counts them.
* .NET TimeSpan strings (``00:01:00``, ``1.00:00:00``, ``00:00:00.5``), what configs written from .NET code or ``az``
  output carry.

TimeSpan.MaxValue (``P10675199DT2H48M5.4775807S`` or ``10675199.02:48:05.4775807``), the service's "never", is finer
than a timedelta can hold, so it becomes ``TIMESPAN_MAX``, the core's "never"; anything longer cannot exist in .NET
and is refused. A bare number is refused because .NET would read ``"30"`` as 30 *days*, rarely what was meant.
Parsing counts in 100 ns ticks (Decimal for fractions), so a value is exact up to the tick and truncated below it,
as .NET does. (``isodate`` parses ISO durations but gives years and months calendar meaning and knows no TimeSpan
form; what is needed here is these few lines.) Nothing is kept in memory.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from .entities import TIMESPAN_MAX
from .errors import ArgumentError

__all__ = ["TIMESPAN_MAX_TEXT", "format_duration", "parse_duration"]

TIMESPAN_MAX_TEXT = "P10675199DT2H48M5.4775807S"  # .NET TimeSpan.MaxValue: the service's "never"

_TICKS_PER_SECOND = 10_000_000  # .NET TimeSpan ticks are 100 ns
_TIMESPAN_MAX_TICKS = 2**63 - 1  # TimeSpan.MaxValue
_CLAMP_TICKS = (TIMESPAN_MAX // timedelta(microseconds=1)) * 10  # TIMESPAN_MAX is MaxValue truncated to µs
_NUMBER = r"\d+(?:[.,]\d+)?"
_ISO_DURATION = re.compile(
    rf"(?P<sign>[-+])?P(?:(?P<Y>{_NUMBER})Y)?(?:(?P<Mo>{_NUMBER})M)?(?:(?P<W>{_NUMBER})W)?(?:(?P<D>{_NUMBER})D)?"
    rf"(?:T(?:(?P<H>{_NUMBER})H)?(?:(?P<Mi>{_NUMBER})M)?(?:(?P<S>{_NUMBER})S)?)?"
)
_ISO_UNITS = {"Y": 365 * 86400, "Mo": 30 * 86400, "W": 7 * 86400, "D": 86400, "H": 3600, "Mi": 60, "S": 1}
_DOTNET_TIMESPAN = re.compile(
    r"(?P<sign>-)?(?:(?P<d>\d+)\.)?(?P<h>\d{1,2}):(?P<m>\d{1,2})(?::(?P<s>\d{1,2})(?:\.(?P<f>\d{1,7}))?)?"
)


def parse_duration(text: str | None, what: str = "") -> timedelta:
    """An ISO 8601 duration or a .NET TimeSpan string as a timedelta; ArgumentError (its message prefixed with
    ``what``, when given) for anything else."""
    prefix = f"{what}: " if what else ""
    if not isinstance(text, str):
        kind = "null" if text is None else type(text).__name__
        raise ArgumentError(f"{prefix}a duration must be a string such as 'PT1M', not {kind}")
    raw = text.strip()
    ticks = _iso_ticks(raw.upper())
    if ticks is None:
        ticks = _dotnet_ticks(raw)
    if ticks is None:
        hint = " (a bare number is ambiguous: write 'PT30S' or 'P30D')" if raw.isdigit() else ""
        raise ArgumentError(
            f"{prefix}{text!r} is not a duration: use ISO 8601 ('PT1M', 'P1D', 'P1DT2H') or a .NET TimeSpan "
            f"('00:01:00', '1.00:00:00'){hint}"
        )
    if abs(ticks) > _TIMESPAN_MAX_TICKS:
        raise ArgumentError(
            f"{prefix}{text!r} is longer than TimeSpan.MaxValue ({TIMESPAN_MAX_TEXT}), the longest duration"
        )
    if ticks >= _CLAMP_TICKS:
        return TIMESPAN_MAX
    if ticks <= -_CLAMP_TICKS:
        return -TIMESPAN_MAX
    sign = -1 if ticks < 0 else 1
    return sign * timedelta(microseconds=abs(ticks) // 10)


def _iso_ticks(text: str) -> int | None:
    match = _ISO_DURATION.fullmatch(text)
    if match is None:
        return None
    parts = {k: v for k, v in match.groupdict().items() if k != "sign" and v is not None}
    if not parts or text.endswith("T"):
        return None  # "P" and "PT" name no component
    total = Decimal(0)
    for unit, value in parts.items():
        total += Decimal(value.replace(",", ".")) * _ISO_UNITS[unit] * _TICKS_PER_SECOND
    ticks = int(total)  # truncates below 100 ns, as .NET does
    return -ticks if match.group("sign") == "-" else ticks


def _dotnet_ticks(text: str) -> int | None:
    match = _DOTNET_TIMESPAN.fullmatch(text)
    if match is None:
        return None
    hours, minutes, seconds = int(match["h"]), int(match["m"]), int(match["s"] or 0)
    if hours > 23 or minutes > 59 or seconds > 59:
        return None  # .NET refuses these too ("25:00:00" is not 25 hours)
    total = ((int(match["d"] or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    ticks = total * _TICKS_PER_SECOND + int((match["f"] or "0").ljust(7, "0"))
    return -ticks if match["sign"] else ticks


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
