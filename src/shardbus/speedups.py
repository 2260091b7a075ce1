"""Compiled variants of the hot modules (Cython, pure Python mode), and the rule for when one may be imported.

The ``.py`` file is the one source and always the fallback. ``setup.py`` compiles each module named in ``MODULES``
as it is, under its own name (so its classes, functions and relative imports are exactly the pure module's), but
writes the extension into ``shardbus/_speedups/<dotted_name>_<digest>/`` where ``<digest>`` is the start of the
SHA-256 of the source bytes it compiled. Nothing compiled ever sits next to its ``.py``, so the ordinary import
system never sees one (in an editable install an in-place ``x.so`` beside ``x.py`` would shadow it).

``install()`` (called first thing by ``shardbus/__init__.py``) puts a finder at the front of ``sys.meta_path``. For
a name in ``MODULES`` it finds the ``.py`` the normal way, hashes it, and answers with the compiled extension only
if one was built from exactly those bytes for this interpreter (the extension suffix names the ABI); an edited
source, a module the build skipped (no compiler, a compile error) or ``SHARDBUS_PURE_PYTHON`` set to anything but
``""``/``0`` means the finder steps aside and the ``.py`` is imported as always.

Memory: the set of names and one hash per compiled module looked up (each module is imported once).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# The modules compiled when a C compiler is at hand: measured hot paths only (docs/performance.md has the figures
# that put each one here). setup.py reads this tuple with ``ast`` (it cannot import the package it builds).
MODULES: tuple[str, ...] = (
    "shardbus.amqp.connection",
    "shardbus.amqp.session",
    "shardbus.amqp.framing",
    "shardbus.amqp.transport",
    "shardbus.amqp.performatives",
    "shardbus.amqp.codec",
    "shardbus.amqp.link",
    "shardbus.endpoint.mapping",
    "shardbus.endpoint.receiving",
    "shardbus.endpoint.sending",
    "shardbus.endpoint.connection",
    "shardbus.partition.broker",
    "shardbus.entity.entity",
    "shardbus.entity.receiver",
    "shardbus.store.records",
    "shardbus.model.routing",
    "shardbus.message_wire",
)

DIGEST_CHARS = 16  # 64 bits of SHA-256: a stale build is found by accident with odds of 2**-64
SPEEDUPS_DIR = Path(__file__).resolve().parent / "_speedups"
PURE_ENV = "SHARDBUS_PURE_PYTHON"


def source_digest(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()[:DIGEST_CHARS]


def variant_dir_name(fullname: str, digest: str) -> str:
    """The folder under ``_speedups`` that holds ``fullname``'s extension compiled from source with ``digest``."""
    return f"{fullname.replace('.', '_')}_{digest}"


def pure_python_forced() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def compiled_path(fullname: str, source: Path) -> Path | None:
    """The extension built from ``source`` exactly as it is now, for this interpreter, or None."""
    try:
        digest = source_digest(source.read_bytes())
    except OSError:
        return None
    folder = SPEEDUPS_DIR / variant_dir_name(fullname, digest)
    leaf = fullname.rpartition(".")[2]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / (leaf + suffix)
        if candidate.is_file():
            return candidate
    return None


class CompiledFinder(importlib.abc.MetaPathFinder):
    """Answers for the names in ``MODULES`` with their compiled variant when it matches the source; else None."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names or pure_python_forced():
            return None
        pure = importlib.machinery.PathFinder.find_spec(fullname, path)
        if pure is None or pure.origin is None or not pure.origin.endswith(".py"):
            return None
        extension = compiled_path(fullname, Path(pure.origin))
        if extension is None:
            return None
        return importlib.util.spec_from_file_location(fullname, extension)


_finder = CompiledFinder(MODULES)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` is a compiled variant (its file is an extension, not the ``.py``)."""
    origin = getattr(module, "__file__", None) or ""
    return any(origin.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def status() -> dict[str, bool]:
    """For each compiled-capable module: whether a variant matching its current source is built and usable."""
    result = {}
    for name in MODULES:
        parent = name.rpartition(".")[0]
        pure = importlib.machinery.PathFinder.find_spec(name, importlib.import_module(parent).__path__)
        usable = pure is not None and pure.origin is not None and compiled_path(name, Path(pure.origin)) is not None
        result[name] = usable and not pure_python_forced()
    return result
