"""bench/speedups.py reads the figures of the benches it runs (their output formats are the contract)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "speedups.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("speedups_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


AMQP_OUT = """\
own-produce-unsettled      n=10000  shardbus=  7,543 msg/s  null=  8,742 msg/s  ratio=0.86  broker_cpu=  27.1 us/msg \
(loop 17.2 + stores 10.0; null 11.1)  target MISSED
"""

SCALE_OUT = """\
shardbus serve                                                12,345                    10,000   \
                  8,000             66 / 60           50.0
shardbus serve --workers 0                          12,000 (11,000-13,000)                    10,100   \
                  8,100             65 / 61           50.0
RabbitMQ 3.10.8                                               11,000                    13,000   \
                 10,000             99 / 56           50.0
CPU us/msg (broker / clients), shardbus serve: send 30 / 20, receive 40 / 30, both 66 / 60
ratio default/RabbitMQ: 0.92 (0.90-0.95) end to end (target >= 1.5: MISSED)
"""


def test_parsers_read_the_benches_lines():
    bench = load_bench()
    assert bench.parse_amqp(AMQP_OUT) == {
        "own-produce-unsettled msg/s": 7543.0,
        "own-produce-unsettled ratio to null": 0.86,
        "own-produce-unsettled broker us/msg": 27.1,
    }
    scale = bench.parse_scale(SCALE_OUT)
    assert scale["default both msgs/s"] == 8000.0 and scale["--workers 0 send msgs/s"] == 12000.0
    assert scale["RabbitMQ 3.10.8 receive msgs/s"] == 13000.0
    assert scale["default both broker us/msg"] == 66.0 and scale["default both clients us/msg"] == 60.0
    assert scale["default/RabbitMQ end to end"] == 0.92
    assert bench.parse_instructions("instructions per message: 112,561\n") == {"instructions/msg": 112561.0}


def test_every_measured_module_exists():
    bench = load_bench()
    for name in bench.MODULES:
        assert bench.source_of(name).is_file(), name
