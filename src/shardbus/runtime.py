"""What every shardbus process sets up before it serves, whichever role it has (the broker, a front end, a worker):
its event loop and its garbage collector's settings. Below everything that runs a loop; keeps nothing.
"""

from __future__ import annotations

import asyncio
import gc

from . import stalltrace


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when available (faster I/O), else asyncio's."""
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        loop = asyncio.new_event_loop()
    stalltrace.watch_loop(loop)
    return loop


def tune_garbage_collector() -> None:
    """Keep Python's cyclic collector from walking every stored message over and over.

    The broker holds its messages in memory; with the default thresholds each full collection scans all of them,
    which the AMQP benchmark measured at about half of the broker's CPU per message. Broker objects rarely form
    cycles, so collections can be much rarer, and what start-up loaded is moved out of the collector's sight.
    """
    stalltrace.watch_gc()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
