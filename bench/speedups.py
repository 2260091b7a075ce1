"""What compiling the hot modules with Cython (pure Python mode) would save, measured by the project's own benches.

Nothing compiled ships with shardbus (docs/performance.md has the figures and why). This script builds the
measurement's compiled variants itself: each module in ``MODULES`` (or ``--modules``) is compiled by Cython 3 as it
is, under its own name, into a folder of its own (never next to its ``.py``, so nothing else ever imports it), and
a ``sitecustomize.py`` in that folder puts a finder first on ``sys.meta_path`` that answers for exactly those
names with their extension. A run of a bench gets the compiled variants when that folder is on its
``PYTHONPATH``, which every process it starts inherits (brokers, workers, our own clients, callgrind's replay).

Then it runs one bench several times, alternating compiled and pure (which goes first alternates too, so drift of
the machine's speed reaches both alike), reads the figures each run prints, and ends with each figure's median
and range per variant and the per-round ratio compiled / pure (paired within a round).

    python bench/speedups.py scale [--rounds R] [-- scale.py args]     default: --brokers default,workers0
    python bench/speedups.py amqp  [--rounds R] [-- amqp.py args]      default: --only own-,sdk-peek
    python bench/speedups.py instructions [-- amqp_instructions.py args]  callgrind counts (--rounds 1 is enough)
    python bench/speedups.py build                                      only build, print the build's time

Options: ``--modules a.b,c.d`` compiles only those (dotted names under ``shardbus``), ``--build-dir DIR`` keeps
the build there and reuses it while the sources are unchanged (a build of every module takes minutes), ``--opt``
the C optimisation flags (default ``-O2 -g0``; Python's own are ``-O3 -g``), ``--keep FILE`` appends every run's
output to FILE. Needs Cython (``pip install cython==3.3.1``) and a C compiler.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
VARIANTS = ("compiled", "pure")

# The modules measured: every module with a share of the broker's event-loop time in bench/amqp.py --profile
# (own- and sdk-peek lines), and the AMQP engine our own client runs on.
MODULES = (
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
DIRECTIVES = {
    "language_level": 3,
    # annotations stay hints, as in the pure module: typed, `x: float` would be a C double, `x: list` exact
    "annotation_typing": False,
    "binding": True,
}
SITECUSTOMIZE = """\
# Written by bench/speedups.py: these modules import from their compiled variant.
import importlib.util
import sys

COMPILED = {compiled!r}


class _Compiled:
    def find_spec(self, name, path=None, target=None):
        where = COMPILED.get(name)
        return importlib.util.spec_from_file_location(name, where) if where else None


sys.meta_path.insert(0, _Compiled())
"""

DEFAULT_ARGS = {
    "scale": ["--brokers", "default,workers0", "--count", "10000", "--no-install"],
    "amqp": ["--only", "own-,sdk-peek"],
    "instructions": ["--path", "produce"],
}
SCRIPTS = {"scale": "scale.py", "amqp": "amqp.py", "instructions": "amqp_instructions.py"}
NUMBER = r"([\d,]+(?:\.\d+)?)"


def source_of(name: str) -> Path:
    return SRC.joinpath(*name.split(".")).with_suffix(".py")


def build(modules: list[str], folder: Path, opt: str) -> float:
    """Compile ``modules`` into ``folder`` (reused when the sources and flags are those of its last build); write
    its sitecustomize.py. Returns the build's wall time in seconds (0 when reused)."""
    stamp = hashlib.sha256(
        json.dumps(
            [opt, DIRECTIVES, [(m, hashlib.sha256(source_of(m).read_bytes()).hexdigest()) for m in modules]]
        ).encode()
    ).hexdigest()
    if (folder / "stamp").is_file() and (folder / "stamp").read_text() == stamp:
        return 0.0
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    started = time.monotonic()
    extensions = []
    for name in modules:
        # a copy, so that the module's own folder gets no generated file; the extension has the module's real
        # name (its classes, functions and relative imports are the pure module's)
        copy = folder / "src" / name.replace(".", "_") / source_of(name).name
        copy.parent.mkdir(parents=True)
        copy.write_bytes(source_of(name).read_bytes())
        (c_module,) = cythonize(
            [Extension(name, [str(copy)], extra_compile_args=opt.split())],
            compiler_directives=DIRECTIVES,
            quiet=True,
        )
        extensions.append(c_module)
    dist = Distribution({"name": "shardbus-speedups-bench", "ext_modules": extensions})
    command = dist.get_command_obj("build_ext")
    command.build_lib = str(folder / "lib")
    command.build_temp = str(folder / "tmp")
    command.parallel = os.cpu_count() or 1
    dist.run_command("build_ext")
    compiled = {ext.name: command.get_ext_fullpath(ext.name) for ext in extensions}
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(compiled=compiled))
    (folder / "stamp").write_text(stamp)
    return time.monotonic() - started


def scale_name(label: str) -> str:
    """``shardbus serve`` is the default; other modes by their flags; RabbitMQ as it is labelled."""
    label = label.strip()
    return "default" if label == "shardbus serve" else label.removeprefix("shardbus serve ").strip()


def parse_scale(out: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"CPU us/msg \(broker / clients\), (.*?): (send .*)", line)
        if m:
            name = scale_name(m.group(1))
            for phase, broker, client in re.findall(rf"(\w+) {NUMBER} / {NUMBER}", m.group(2)):
                figures[f"{name} {phase} broker us/msg"] = number(broker)
                figures[f"{name} {phase} clients us/msg"] = number(client)
        m = re.match(rf"ratio default/RabbitMQ: {NUMBER}.*? (end to end|send|receive) ", line)
        if m:
            figures[f"default/RabbitMQ {m.group(2)}"] = number(m.group(1))
        cell = rf"{NUMBER}(?: \([^)]*\))?"
        m = re.match(rf"(shardbus serve(?: --[\w-]+ \d+)*|RabbitMQ \S+)\s{{2,}}{cell}\s+{cell}\s+{cell}", line)
        if m:
            name = scale_name(m.group(1))
            for phase, value in zip(("send", "receive", "both"), m.groups()[1:4], strict=True):
                figures[f"{name} {phase} msgs/s"] = number(value)
    return figures


def parse_amqp(out: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(
            rf"(\S+)\s+n=\d+\s+shardbus=\s*{NUMBER} msg/s.*?ratio={NUMBER}\s+broker_cpu=\s*{NUMBER} us/msg", line
        )
        if m:
            figures[f"{m.group(1)} msg/s"] = number(m.group(2))
            figures[f"{m.group(1)} ratio to null"] = number(m.group(3))
            figures[f"{m.group(1)} broker us/msg"] = number(m.group(4))
    return figures


def parse_instructions(out: str) -> dict[str, float]:
    m = re.search(rf"instructions per message: {NUMBER}", out)
    return {"instructions/msg": number(m.group(1))} if m else {}


PARSERS = {"scale": parse_scale, "amqp": parse_amqp, "instructions": parse_instructions}


def number(text: str) -> float:
    return float(text.replace(",", ""))


def run(bench: str, variant: str, args: list[str], site: Path, keep: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if variant == "compiled":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, str(HERE / SCRIPTS[bench]), *args], env=env, capture_output=True, text=True, check=False
    )
    if keep:
        with open(keep, "a") as f:
            f.write(f"=== {bench} {variant}\n{done.stdout}\n{done.stderr[-3000:]}\n")
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"{bench} ({variant}) failed with exit status {done.returncode}")
    figures = PARSERS[bench](done.stdout)
    if not figures:
        sys.stderr.write(done.stdout[-3000:])
        raise SystemExit(f"{bench} ({variant}): no figures found in its output")
    return figures


def fmt(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    if abs(med) < 10:
        digits = max(digits, 2)  # ratios
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", choices=[*sorted(SCRIPTS), "build"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one run of every variant")
    parser.add_argument("--modules", help="comma-separated module names to compile (default: all measured)")
    parser.add_argument("--build-dir", help="keep the build here (reused while the sources are unchanged)")
    parser.add_argument("--opt", default="-O2 -g0", help="C compiler flags added to Python's")
    parser.add_argument("--keep", help="append every run's output to this file")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    rest = argv[cut + 1 :] or DEFAULT_ARGS.get(args.bench, [])
    modules = [m.strip() for m in args.modules.split(",")] if args.modules else list(MODULES)
    with tempfile.TemporaryDirectory(prefix="shardbus-speedups-") as tmp:
        folder = Path(args.build_dir or tmp)
        seconds = build(modules, folder, args.opt)
        print(f"{len(modules)} modules compiled ({args.opt}): " + (f"{seconds:.0f} s" if seconds else "reused"))
        if args.bench == "build":
            return
        results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                figures = run(args.bench, variant, rest, folder / "site", args.keep)
                results[variant].append(figures)
                shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
                print(f"round {r + 1} {variant}: {shown}", flush=True)
    keys = [k for k in results["compiled"][0] if all(k in f for v in VARIANTS for f in results[v])]
    print()
    print(f"{'figure':<44}{'compiled':>26}{'pure':>26}{'compiled/pure':>22}")
    for key in keys:
        comp = [f[key] for f in results["compiled"]]
        pure = [f[key] for f in results["pure"]]
        ratios = [c / p for c, p in zip(comp, pure, strict=True) if p]
        print(f"{key:<44}{fmt(comp, 1):>26}{fmt(pure, 1):>26}{fmt(ratios, 3):>22}")


if __name__ == "__main__":
    main()
