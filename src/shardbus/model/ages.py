"""An age for people to read (``2m 4s``, ``3h 5m``, ``2d 1h``): the CLI's ``stats`` and the explorer's pages."""

from __future__ import annotations


def human_age(seconds: float | None) -> str | None:
    """``seconds`` as its two largest units; None for no age (nothing queued)."""
    if seconds is None:
        return None
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
