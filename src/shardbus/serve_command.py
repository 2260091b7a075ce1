"""``shardbus serve``: its options (argparse, so that a broker's start-up does not pay for click), its start-up
lines, and running one broker (``server.Broker``) or the supervisor of ``--frontends M`` (``frontends.py``).

Below ``cli.py`` (which dispatches to it) and ``cli_commands/`` (which lists it in ``shardbus --help``). Keeps
nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .endpoint.limits import DEFAULT_LIMITS
from .extras import MissingExtra
from .logs import configure as configure_logs
from .model.errors import ShardbusError
from .namespace import DEFAULT_NAMESPACE
from .server import DEFAULT_KEY, Broker, connection_string

if TYPE_CHECKING:
    from .http.tls import TlsFiles


def mode(args: argparse.Namespace) -> str:
    """Where the partition brokers run, as the start-up lines and ``--help`` say it."""
    if args.metadata:
        where = "on the workers registered in the metadata store"
    elif args.workers > 0:
        where = f"in {args.workers} worker process{'es' if args.workers > 1 else ''}"
    else:
        where = "in this process (embedded)"
    front = f"{args.frontends} front-end processes, " if args.frontends > 1 else ""
    return f"{front}partitions {where}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _print_ready(args: argparse.Namespace, port: int, started: float, conn_str: str, tls: TlsFiles) -> None:
    print(f"shardbus listening on {args.host}:{port} (ready in {time.monotonic() - started:.2f} s)")
    print(f"mode: {mode(args)}")
    print(f"data directory: {args.data_dir}")
    print(f"connection string: {conn_str}")
    if tls.ca is not None:
        print(f"HTTPS (admin client) CA certificate: {tls.ca}  (connection_verify=<this file>)")
    else:
        print(f"HTTPS certificate: {tls.cert}")
    print(f"explorer: http://{args.host}:{port}/explorer  (sign in with the connection string)")
    print(f"health: http://{args.host}:{port}/health", flush=True)


def _serve_frontends(args: argparse.Namespace) -> int:
    """``--frontends M`` (M > 1): this process supervises workers and front-end processes (frontends.py)."""
    started = time.monotonic()
    from .frontends import FrontendSupervisor
    from .http.tls import ensure_certificates, own_certificate
    from .namespace import remove_orphan_partitions

    if args.workers < 1 and not args.metadata:
        print("shardbus: cannot start: --frontends needs --workers 1 or more (or --metadata)", file=sys.stderr)
        return 2
    extra = ["--namespace", args.namespace, "--log-level", args.log_level, "--log-format", args.log_format]
    for flag, value in (("--config", args.config), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if value is not None:
            extra += [flag, str(Path(value).resolve())]
    for name in args.tls_host or ():
        extra += ["--tls-host", name]
    extra += ["--max-connections", str(args.max_connections), "--idle-timeout", str(args.idle_timeout)]
    try:
        if args.config is not None:
            from .config import load_config

            load_config(args.config)  # checked whole before any process starts (each front end applies it)
        if args.tls_cert is not None and args.tls_key is not None:
            tls = own_certificate(args.tls_cert, args.tls_key)
        else:  # created here, once, before front ends that would race to create them
            tls = ensure_certificates(args.data_dir, [args.host, *(args.tls_host or ())])
        remove_orphan_partitions(args.data_dir)  # here, while no front end can be creating an entity
        supervisor = FrontendSupervisor(
            args.data_dir,
            args.host,
            args.port,
            args.key,
            0 if args.metadata else args.workers,
            args.frontends,
            extra,
            args.config is not None,
            metadata=args.metadata,
        )
        supervisor.stop_on_signals().start()
    except (ShardbusError, OSError, ValueError, RuntimeError, MissingExtra) as exc:
        print(f"shardbus: cannot start: {exc}", file=sys.stderr)
        return 2
    _print_ready(args, supervisor.port, started, connection_string(args.host, supervisor.port, args.key), tls)
    try:
        supervisor.serve_until_signal()
    finally:
        supervisor.close()
    print("shardbus stopped; everything acknowledged is on disk.", flush=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.frontends > 1:
        return _serve_frontends(args)
    started = time.monotonic()
    try:
        broker = Broker(
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            key=args.key,
            namespace=args.namespace,
            config=args.config,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_hosts=args.tls_host or (),
            workers=0 if args.metadata else args.workers,
            metadata=args.metadata,
            fork_workers=True,  # nothing is open in this process yet: workers start in ~50 ms, not ~400
            max_connections=args.max_connections,
            idle_timeout=args.idle_timeout or None,
        )
    except (ShardbusError, OSError, ValueError, MissingExtra) as exc:
        print(f"shardbus: cannot start: {exc}", file=sys.stderr)
        return 2

    def ready(b: Broker) -> None:
        _print_ready(args, b.server.port, started, b.connection_string, b.tls)

    try:
        broker.serve_forever(on_ready=ready)
    except OSError as exc:
        print(f"shardbus: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print("shardbus stopped; everything acknowledged is on disk.", flush=True)
    return 0


def serve_main(argv: list[str]) -> int:
    """``shardbus serve ...`` (``argv`` starts with "serve"), with its own argparse parser as always."""
    parser = argparse.ArgumentParser(
        prog="shardbus", description="Azure Service Bus partitioned entities, self-hosted."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="run the broker in the foreground", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=5672, help="AMQP port (0: any free port)")
    serve.add_argument("--data-dir", default="./shardbus-data", help="data directory")
    serve.add_argument("--config", default=None, help="the official emulator's Config.json (plus extensions)")
    serve.add_argument("--key", default=DEFAULT_KEY, help="the SharedAccessKey of RootManageSharedAccessKey")
    serve.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the default namespace")
    serve.add_argument(
        "--tls-cert", default=None, help="HTTPS certificate chain (PEM) to use instead of the local CA's"
    )
    serve.add_argument("--tls-key", default=None, help="private key (PEM) of --tls-cert")
    serve.add_argument(
        "--tls-host",
        action="append",
        default=None,
        metavar="NAME",
        help="another host name for the local CA's server certificate (repeatable)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="run the partition brokers in N worker processes (0: in this process, the embedded default and the "
        "fastest on one machine)",
    )
    serve.add_argument(
        "--frontends",
        type=int,
        default=1,
        metavar="M",
        help="serve the port from M front-end processes sharing the workers (SO_REUSEPORT; 1: this process)",
    )
    serve.add_argument(
        "--metadata",
        default=None,
        metavar="DSN",
        help="serve partitions from the workers (any host) registered in this PostgreSQL metadata store",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive_int,
        default=DEFAULT_LIMITS.max_connections,
        metavar="N",
        help="AMQP connections served at once (per front end); more are refused with amqp:resource-limit-exceeded",
    )
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_LIMITS.idle_timeout,
        metavar="SECONDS",
        help="idle time-out announced to clients; a connection silent twice as long is closed (0: never)",
    )
    serve.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    serve.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default="auto",
        help="auto: text on a terminal, JSON lines otherwise (default: auto)",
    )
    serve.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    configure_logs(args.log_level, None if args.log_format == "auto" else args.log_format == "json")
    return args.func(args)
