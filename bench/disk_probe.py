"""The disk's own pace, in a process of its own: a 4 KB overwrite and an ``fdatasync`` of a small file, open loop.

bench/soak.py starts it beside the broker (``DiskProbe``), on a file next to the broker's data directory (the same
filesystem, so the same device and its queue), and reads its samples from this process's stdout: one record per
sync, ``struct`` ``<dd``: the monotonic time the schedule had it due (CLOCK_MONOTONIC, shared by every process on
the machine, so it matches the broker's stall trace) and its latency in ms counted from then.

Why a process and why open loop:

- A process of its own takes no part in the soak's GIL (its SDK threads, its garbage collections) nor the broker's:
  what it waits for is the device and the kernel, so a slow sample is the disk's, not Python's.
- Open loop (each sync has a due time on a fixed schedule, and its latency counts from then, whatever the previous
  one took) is how the soak times its sends. A disk stall of 139 ms then delays every sync due inside it, as it
  delays every send due inside it: the share of samples a bad second spoils is the share of time it lasted, at any
  rate, so the probe's p99 moves with the disk as a send's does. A closed loop would count one slow sample per
  stall however long it was.
- The file is written once in full and synced before the first sample, and each sample overwrites a block of it:
  an ``fdatasync`` then flushes the data block and the device's cache, not the file's size or block map (as a
  SQLite WAL after its first checkpoint).

At the default 50 a second that is 15,000 samples in a 5-minute interval, 150 above its p99, and a bad second is
50 of them; each sync writes 4 KB (200 KB/s, next to the broker's megabytes). It exits when its parent does (its
parent's pid changes) or on SIGTERM.

    python bench/disk_probe.py FILE [--rate 50]
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
import time

RECORD = struct.Struct("<dd")  # (due, monotonic s; latency, ms)
BLOCK = 4096
BLOCKS = 64  # the file: 256 KB, overwritten round and round


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the file to sync (created, on the filesystem to probe)")
    parser.add_argument("--rate", type=float, default=50.0, help="syncs a second")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parent = os.getppid()
    fd = os.open(args.file, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"\0" * BLOCK * BLOCKS)
    os.fsync(fd)
    block = b"d" * BLOCK
    out = sys.stdout.fileno()
    period = 1.0 / args.rate
    due = time.monotonic() + period
    n = 0
    try:
        while os.getppid() == parent:
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            os.pwrite(fd, block, (n % BLOCKS) * BLOCK)
            os.fdatasync(fd)
            os.write(out, RECORD.pack(due, (time.monotonic() - due) * 1000))
            n += 1
            due += period
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
