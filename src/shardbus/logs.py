"""Log output of ``shardbus serve``: readable lines on a terminal, one JSON object per line otherwise (for log
collectors). Records may carry ``connection`` and ``link`` (the endpoint logs with them as ``extra``); both
formats show them."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

CONTEXT_FIELDS = ("connection", "link", "entity")


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT_FIELDS if getattr(record, k, None))
        return f"{line} [{context}]" if context else line


def configure(level: str = "info", json_output: bool | None = None, stream: TextIO | None = None) -> None:
    """Send shardbus's logs to ``stream`` (stderr): JSON unless it is a terminal (or as ``json_output`` says)."""
    stream = stream or sys.stderr
    if json_output is None:
        json_output = not stream.isatty()
    handler = logging.StreamHandler(stream)
    if json_output:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
