"""The ``shardbus`` command: ``serve`` here, the commands for a running broker in ``cli_commands/``."""

from __future__ import annotations

import argparse
import sys
import time

from .logs import configure as configure_logs
from .model.errors import ShardbusError
from .namespace import DEFAULT_NAMESPACE
from .server import DEFAULT_KEY, Broker


def _serve(args: argparse.Namespace) -> int:
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
            workers=args.workers,
        )
    except (ShardbusError, OSError, ValueError) as exc:
        print(f"shardbus: cannot start: {exc}", file=sys.stderr)
        return 2

    def ready(b: Broker) -> None:
        print(f"shardbus listening on {args.host}:{b.server.port} (ready in {time.monotonic() - started:.2f} s)")
        print(f"data directory: {args.data_dir}")
        print(f"connection string: {b.connection_string}")
        if b.ca_path is not None:
            print(f"HTTPS (admin client) CA certificate: {b.ca_path}  (connection_verify=<this file>)")
        else:
            print(f"HTTPS certificate: {b.tls.cert}")
        print(f"health: http://{args.host}:{b.server.port}/health", flush=True)

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
        help="run the partition brokers in N worker processes (0: inside the serving process)",
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["serve"]:
        # Straight to argparse: the broker's start-up does not pay for importing click and rich.
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
