"""How the commands show things: rich tables, colors and progress bars on a terminal, aligned plain text when
the output goes to a pipe or file, and JSON with ``--json``.

Commands describe what to show (columns and rows of plain values, or a key/value record) and leave the form to
``Output``, so every command behaves the same way in all three modes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Values in a column whose text is one of these get a color on a terminal.
_STYLES = {
    "healthy": "green",
    "Available": "green",
    "Active": "green",
    "DOWN": "bold red",
    "Limited": "bold red",
    "Disabled": "yellow",
    "SendDisabled": "yellow",
    "ReceiveDisabled": "yellow",
}


@dataclass(frozen=True, slots=True)
class Column:
    key: str  # the row dict's key (also the JSON key)
    title: str
    numeric: bool = False  # right-aligned


class Output:
    """One command's output. ``json`` mode prints exactly one JSON document on stdout (or JSON lines where a
    command says so); otherwise a terminal gets rich tables and colors, anything else plain aligned text."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        # Created per command, so they write to the streams of the moment (click's CliRunner swaps them).
        self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err_console = Console(file=sys.stderr, highlight=False, soft_wrap=True)

    @property
    def terminal(self) -> bool:
        """Rich output (tables, colors) only where a person is looking and no JSON was asked for."""
        return not self.json_mode and self.console.is_terminal

    # ----------------------------------------------------------------------------------------------- data
    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, default=json_default, ensure_ascii=False))

    def table(self, columns: Sequence[Column], rows: Sequence[dict[str, Any]], title: str | None = None) -> None:
        """Rows as a table (terminal), aligned columns (plain), or a JSON list of the rows (``--json``)."""
        if self.json_mode:
            self.json([{c.key: row.get(c.key) for c in columns} for row in rows])
            return
        if self.terminal:
            table = Table(title=title, title_justify="left", header_style="bold")
            for c in columns:
                table.add_column(c.title, justify="right" if c.numeric else "left", overflow="fold")
            for row in rows:
                table.add_row(*(_styled(cell_text(row.get(c.key))) for c in columns))
            self.console.print(table)
            return
        if title:
            click.echo(title)
        click.echo(
            plain_table([c.title for c in columns], [[cell_text(row.get(c.key)) for c in columns] for row in rows])
        )

    def record(self, fields: Sequence[tuple[str, Any]], title: str | None = None, data: Any = None) -> None:
        """One object as name/value lines; ``data`` is what ``--json`` prints (default: the fields as a map)."""
        if self.json_mode:
            self.json(data if data is not None else dict(fields))
            return
        if self.terminal:
            table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
            table.add_column(style="bold cyan")
            table.add_column(overflow="fold")
            for name, value in fields:
                table.add_row(name, _styled(cell_text(value)))
            self.console.print(table)
            return
        if title:
            click.echo(title)
        width = max((len(name) for name, _ in fields), default=0)
        for name, value in fields:
            click.echo(f"{name.ljust(width)}  {cell_text(value)}")

    def done(self, text: str, data: Any = None) -> None:
        """A one-line outcome ("created queue orders"): green on a terminal; ``data`` (or {"result": text})
        with ``--json``."""
        if self.json_mode:
            self.json(data if data is not None else {"result": text})
        elif self.terminal:
            self.console.print(f"[green]✓[/green] {escape(text)}")
        else:
            click.echo(text)

    def note(self, text: str) -> None:
        """A remark for the person (stderr, so it never mixes with data on stdout)."""
        if self.err_console.is_terminal:
            self.err_console.print(f"[dim]{escape(text)}[/dim]")
        else:
            click.echo(text, err=True)

    # ------------------------------------------------------------------------------------------- progress
    @contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[ProgressTask]:
        """A progress bar on stderr when it is a terminal (and no JSON was asked for); silent otherwise."""
        if self.json_mode or not self.err_console.is_terminal:
            yield ProgressTask(None, None)
            return
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err_console,
            transient=True,  # the outcome line says what was done; a finished bar is noise
        )
        with bar:
            yield ProgressTask(bar, bar.add_task(description, total=total))


class ProgressTask:
    """What a long operation advances; does nothing when no bar is shown."""

    def __init__(self, progress: Progress | None, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def total(self, total: int | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)


def escape(text: str) -> str:
    """Text for rich markup (names may contain '[')."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _styled(text: str) -> str:
    style = _STYLES.get(text)
    return f"[{style}]{escape(text)}[/{style}]" if style else escape(text)


def cell_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=json_default, ensure_ascii=False)
    return str(value)


def plain_table(titles: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns separated by two spaces, padded to the widest cell: easy to read and to cut/awk."""
    widths = [len(t) for t in titles]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def json_default(value: Any) -> Any:
    """JSON for what the broker's values may be beyond JSON's own (timestamps, UUIDs, bytes, durations)."""
    import base64
    import uuid
    from datetime import datetime, timedelta

    from ..model.durations import format_duration

    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "to_dict"):  # an authorization rule
        return value.to_dict()
    return str(value)
