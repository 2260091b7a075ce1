"""The ``shardbus`` subcommands for people at a terminal (everything but ``serve``: serve_command.py).

They talk to a running broker only as any client would: entities and rules over the HTTPS management API
(``admin_http``), messages over AMQP with ``shardbus.client.ShardbusClient``. Modules: ``context`` (options,
clients, errors), ``output`` (tables, JSON, progress), ``manage`` (queue/topic/subscription/rule), ``messages``
(send, peek, receive, purge, dead-letter, export, import), ``stats``, ``records`` (messages as JSON lines).
"""

from __future__ import annotations

from typing import Any

import click

from . import manage, messages, stats
from .context import CA_ENV, CONNECTION_ENV, DEFAULT_CONNECTION_STRING, Session, Settings, ShardbusGroup, default_ca


@click.group(
    cls=ShardbusGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    help="Azure Service Bus partitioned entities, self-hosted: run the broker (serve) and manage a running one.",
)
@click.option(
    "--connection-string",
    envvar=CONNECTION_ENV,
    default=DEFAULT_CONNECTION_STRING,
    show_default="the local default",
    help=f"the namespace's connection string [env {CONNECTION_ENV}]",
)
@click.option(
    "--ca",
    envvar=CA_ENV,
    default=None,
    type=click.Path(dir_okay=False),
    help=f"CA certificate for the broker's HTTPS [env {CA_ENV}; default: shardbus-data/tls/ca.pem if present]",
)
@click.option("--timeout", type=float, default=30.0, show_default=True, help="seconds to wait for the broker")
@click.option("--json", "json_", is_flag=True, help="print JSON instead of tables")
@click.pass_context
def app(ctx: click.Context, connection_string: str, ca: str | None, timeout: float, json_: bool) -> None:
    session = ctx.ensure_object(Session)
    session.settings = Settings(connection_string, ca if ca is not None else default_ca(), json_, timeout)


@app.command(
    "serve",
    help="Run the broker in the foreground (see `shardbus serve --help`).",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def serve(ctx: click.Context) -> Any:
    # `shardbus serve` normally never reaches click (cli.main hands it to its own parser); this entry only lists
    # it in `shardbus --help` and serves callers that go through the group.
    from ..serve_command import serve_main

    ctx.exit(serve_main(["serve", *ctx.args]))


for command in (*manage.COMMANDS, *messages.COMMANDS, *stats.COMMANDS):
    app.add_command(command)

__all__ = ["app"]
