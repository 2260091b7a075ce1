"""Optional compiled variants of shardbus's hot modules (see src/shardbus/speedups.py and docs/performance.md).

Everything else about the package is in pyproject.toml. This file only adds extensions: each module named in
``shardbus.speedups.MODULES`` is compiled by Cython in pure Python mode, from a copy of its current bytes, into
``shardbus/_speedups/<dotted_name>_<digest>/<leaf>.<ext>``; the finder in ``shardbus.speedups`` imports it only while
the ``.py`` still hashes to ``<digest>``. The build never fails the install: no Cython, a Cython error, no C compiler
or a compile error prints a warning and leaves that module pure Python. ``SHARDBUS_PURE_PYTHON=1`` at install time
compiles nothing.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"
SPEEDUPS = SRC / "shardbus" / "speedups.py"


def speedups_constants() -> tuple[tuple[str, ...], int]:
    """``MODULES`` and ``DIGEST_CHARS`` from speedups.py, read without importing the package being built."""
    values = {}
    for node in ast.parse(SPEEDUPS.read_text()).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("MODULES", "DIGEST_CHARS"):
                values[target.id] = ast.literal_eval(node.value)
    return tuple(values["MODULES"]), int(values["DIGEST_CHARS"])


def warn(message: str) -> None:
    print(f"shardbus: {message}; that part stays pure Python", file=sys.stderr)


def pure_python_forced() -> bool:
    return os.environ.get("SHARDBUS_PURE_PYTHON", "") not in ("", "0")


class OptionalCythonBuild(build_ext):
    """Cythonizes at build time (so a missing or failing Cython is a warning, not an error) and builds every
    extension as optional: a C compile or link error skips that module."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        if pure_python_forced():
            print("shardbus: SHARDBUS_PURE_PYTHON is set: no compiled modules", file=sys.stderr)
            self.extensions = []
            return
        try:
            from Cython.Build import cythonize
        except ImportError as error:
            warn(f"Cython is not importable ({error})")
            self.extensions = []
            return
        built = []
        for ext in self.extensions:
            try:
                built.append(self.cythonize_one(cythonize, ext))
            except Exception as error:  # a Cython error in one module must not stop the others
                warn(f"Cython could not compile {ext.name} ({error})")
        self.extensions = built
        super().run()

    def copy_extensions_to_source(self) -> None:
        # An editable install copies each extension into src/; its _speedups folder does not exist yet.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package = ext.name.rpartition(".")[0]
            Path(build_py.get_package_dir(package)).mkdir(parents=True, exist_ok=True)
        super().copy_extensions_to_source()

    def cythonize_one(self, cythonize, ext: Extension) -> Extension:
        """Cython's C for ``ext`` (whose one source is the copy made by ``variants``), generated for the module's
        real name so that its classes and relative imports are the pure module's; the extension keeps its
        ``_speedups`` name, which decides only where the file goes."""
        real_name = ext.real_name  # type: ignore[attr-defined]
        (c_module,) = cythonize(
            [Extension(real_name, ext.sources)],
            compiler_directives={
                "language_level": 3,
                # Annotations stay hints, as in the pure module: with typing on, `x: float` would become a C
                # double and `x: list` would refuse a subclass.
                "annotation_typing": False,
                "binding": True,
            },
            quiet=True,
            build_dir=str(Path(self.build_temp) / "cython"),
        )
        ext.sources = list(c_module.sources)
        ext.optional = True
        return ext


def variants() -> list[Extension]:
    """One extension per compiled-capable module, from a copy of its source taken now (its hash names the folder)."""
    modules, digest_chars = speedups_constants()
    copies = ROOT / "build" / "speedups-src"
    extensions = []
    for name in modules:
        source = SRC.joinpath(*name.split(".")).with_suffix(".py")
        data = source.read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:digest_chars]
        folder = f"{name.replace('.', '_')}_{digest}"
        leaf = name.rpartition(".")[2]
        copy = copies / folder / f"{leaf}.py"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(data)
        ext = Extension(f"shardbus._speedups.{folder}.{leaf}", [str(copy.relative_to(ROOT))], optional=True)
        ext.real_name = name  # type: ignore[attr-defined]
        extensions.append(ext)
    return extensions


setup(ext_modules=variants(), cmdclass={"build_ext": OptionalCythonBuild})
