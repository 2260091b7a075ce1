"""Optional dependencies (the package's extras): imported only on the paths that use them.

A module that needs an extra imports it inside ``try`` and raises ``MissingExtra`` when it is missing: one line
naming what needs it and the ``pip install`` that brings it, which the CLI prints as it is (no traceback)."""

from __future__ import annotations


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, what: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra ({missing} is not installed): pip install 'shardbus[{extra}]'"
        )
        self.extra = extra
