"""Compiled (Cython) against pure Python, measured by the project's own benches, interleaved round by round.

``shardbus.speedups`` swaps in compiled variants of the hot modules when they are built and current;
``SHARDBUS_PURE_PYTHON=1`` turns that off in every process that inherits it (brokers, workers, our own clients).
This script runs one bench several times, alternating the two variants (which goes first alternates too, so drift
of the machine's speed reaches both alike), reads the figures each run prints, and ends with each figure's median
and range per variant and the per-round ratio compiled / pure (paired within a round).

    python bench/speedups.py scale [--rounds R] [-- scale.py args]   default args: --brokers default --count 10000
    python bench/speedups.py amqp  [--rounds R] [-- amqp.py args]    default args: --only own-,sdk-peek
    python bench/speedups.py instructions [-- amqp_instructions.py args]   callgrind counts (one round is enough)

``scale`` reads the default broker's msgs/s per phase, its broker and client CPU per message in "both" and, when
RabbitMQ ran, ``ratio default/RabbitMQ``; ``amqp`` reads each line's msg/s, ratio to the null endpoint and broker
CPU per message; ``instructions`` reads the instructions per message.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("compiled", "pure")

DEFAULT_ARGS = {
    "scale": ["--brokers", "default", "--count", "10000"],
    "amqp": ["--only", "own-,sdk-peek"],
    "instructions": ["--path", "produce"],
}
SCRIPTS = {"scale": "scale.py", "amqp": "amqp.py", "instructions": "amqp_instructions.py"}
NUMBER = r"([\d,]+(?:\.\d+)?)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_scale(out: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    # run 1: default (...)   msgs/s  send 12,345  receive ...  both ...
    for line in out.splitlines():
        m = re.match(r"CPU us/msg \(broker / clients\), (default|shardbus[^:]*): (.*)", line)
        if m and m.group(1) == "default":
            for phase, broker, client in re.findall(rf"(\w+) {NUMBER} / {NUMBER}", m.group(2)):
                figures[f"{phase} broker us/msg"] = number(broker)
                figures[f"{phase} clients us/msg"] = number(client)
        m = re.match(rf"ratio default/RabbitMQ: {NUMBER}.*? (end to end|send|receive) ", line)
        if m:
            figures[f"default/RabbitMQ {m.group(2)}"] = number(m.group(1))
        m = re.match(r"(default\b.*?)\s{2,}(.*)", line)
        if m and "msgs/s" not in line and "/" in line and not line.startswith("ratio"):
            cells = re.findall(rf"{NUMBER}(?: \([^)]*\))?", m.group(2))
            if len(cells) >= 3:
                for phase, cell in zip(("send", "receive", "both"), cells[:3], strict=True):
                    figures[f"{phase} msgs/s"] = number(cell)
    return figures


def parse_amqp(out: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(
            rf"(\S+)\s+n=\d+\s+shardbus=\s*{NUMBER} msg/s.*?ratio={NUMBER}\s+broker_cpu=\s*{NUMBER} us/msg", line
        )
        if m:
            figures[f"{m.group(1)} msg/s"] = number(m.group(2))
            figures[f"{m.group(1)} ratio"] = number(m.group(3))
            figures[f"{m.group(1)} broker us/msg"] = number(m.group(4))
    return figures


def parse_instructions(out: str) -> dict[str, float]:
    m = re.search(rf"{NUMBER} instructions", out)
    return {"instructions/msg": number(m.group(1))} if m else {}


PARSERS = {"scale": parse_scale, "amqp": parse_amqp, "instructions": parse_instructions}


def run(bench: str, variant: str, args: list[str]) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("SHARDBUS_PURE_PYTHON", None)
    if variant == "pure":
        env["SHARDBUS_PURE_PYTHON"] = "1"
    done = subprocess.run(
        [sys.executable, str(HERE / SCRIPTS[bench]), *args], env=env, capture_output=True, text=True, check=False
    )
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
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", choices=sorted(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one run of every variant")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the bench (after --)")
    args = parser.parse_args()
    rest = [a for a in args.rest if a != "--"] or DEFAULT_ARGS[args.bench]
    from shardbus import speedups

    built = speedups.status()
    print(f"compiled variants built and current: {sum(built.values())} of {len(built)}", flush=True)
    if not any(built.values()):
        raise SystemExit("nothing compiled to compare: pip install (or python setup.py build_ext --inplace) first")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            figures = run(args.bench, variant, rest)
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
        print(f"{key:<44}{fmt(comp, 1):>26}{fmt(pure, 1):>26}{fmt(ratios, 2):>22}")


if __name__ == "__main__":
    main()
