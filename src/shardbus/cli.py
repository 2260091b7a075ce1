"""The ``shardbus`` command: ``serve`` (serve_command.py), ``worker`` (cluster/worker.py), and the commands for a
running broker (``cli_commands/``). Each is imported only when asked for: a broker's start-up does not pay for
click and rich, nor the commands for the broker's core.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["serve"]:
        from .serve_command import serve_main  # straight to argparse

        return serve_main(args)
    if args[:1] == ["worker"]:
        from .cluster.worker import main as worker_main  # partition brokers for front ends elsewhere

        return worker_main(args[1:])
    from .cli_commands import app  # everything else: the commands for a running broker (cli_commands/)

    try:
        app.main(args=args, prog_name="shardbus", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
