"""What every command shares: the connection options, the clients they open (lazily, once per invocation), and
turning failures into one clear line on stderr with a non-zero exit.

The options are accepted before the subcommand (``shardbus --json queue list``) and after it
(``shardbus queue list --json``); the later one wins.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import update_wrapper
from pathlib import Path
from typing import Any, TypeVar

import click

from ..amqp.transport import AmqpClientError
from ..client import ClientError, ConnectionSettings, ShardbusClient
from .admin_http import AdminClient, AdminError
from .output import Output

DEFAULT_CONNECTION_STRING = (
    "Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;"
    "UseDevelopmentEmulator=true"
)
DEFAULT_CA = Path("shardbus-data") / "tls" / "ca.pem"  # where `shardbus serve` keeps it by default
CONNECTION_ENV = "SHARDBUS_CONNECTION_STRING"
CA_ENV = "SHARDBUS_CA"

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A failure to report as one line (``error: ...``, red on a terminal) with exit status 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        err = Output(False).err_console
        if err.is_terminal:
            from .output import escape

            err.print(f"[bold red]error:[/bold red] {escape(self.format_message())}")
        else:
            click.echo(f"error: {self.format_message()}", err=True)


@dataclass(slots=True)
class Settings:
    connection_string: str = DEFAULT_CONNECTION_STRING
    ca: str | None = None
    json: bool = False
    timeout: float = 30.0


class Session:
    """One invocation: its settings, its output, and the clients it opened (closed when the command ends)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._amqp: ShardbusClient | None = None
        self._admin: AdminClient | None = None
        self._output: Output | None = None

    @property
    def out(self) -> Output:
        if self._output is None or self._output.json_mode != self.settings.json:
            self._output = Output(self.settings.json)
        return self._output

    def connection(self) -> ConnectionSettings:
        try:
            return ConnectionSettings.parse(self.settings.connection_string)
        except ValueError as exc:
            raise CliError(f"bad connection string: {exc}") from None

    @property
    def amqp(self) -> ShardbusClient:
        """Our AMQP client (messages, and shardbus' own $management operations)."""
        if self._amqp is None:
            self.connection()  # a bad connection string is reported as such, not as a connection failure
            self._amqp = ShardbusClient(self.settings.connection_string, timeout=self.settings.timeout)
        return self._amqp

    @property
    def admin(self) -> AdminClient:
        """The HTTPS management client (entities and rules, runtime counts)."""
        if self._admin is None:
            ca = self.settings.ca
            if ca is not None and not Path(ca).is_file():
                raise CliError(f"--ca {ca}: no such file (the broker's CA is <data-dir>/tls/ca.pem)")
            self._admin = AdminClient(self.connection(), ca, self.settings.timeout)
        return self._admin

    def close(self) -> None:
        if self._amqp is not None:
            self._amqp.close()
            self._amqp = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def default_ca() -> str | None:
    return str(DEFAULT_CA) if DEFAULT_CA.is_file() else None


def _setter(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        source = ctx.get_parameter_source(param.name or attr)
        if value is None or source in (click.core.ParameterSource.DEFAULT, None):
            return  # not given here: the group's value (or the default) stands
        session = ctx.find_object(Session)
        if session is not None:
            setattr(session.settings, attr, value)

    return store


def connection_options(f: F) -> F:
    """``--connection-string``, ``--ca``, ``--timeout`` and ``--json`` on a subcommand (they override the
    group's)."""
    options = [
        click.option(
            "--connection-string",
            default=None,
            expose_value=False,
            callback=_setter("connection_string"),
            help=f"the namespace's connection string [env {CONNECTION_ENV}; default: the local default]",
        ),
        click.option(
            "--ca",
            default=None,
            expose_value=False,
            callback=_setter("ca"),
            type=click.Path(dir_okay=False),
            help=f"CA certificate to verify the broker's HTTPS with [env {CA_ENV}; default: {DEFAULT_CA} if present]",
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            expose_value=False,
            callback=_setter("timeout"),
            help="seconds to wait for the broker [default: 30]",
        ),
        click.option(
            "--json",
            "json_",
            is_flag=True,
            default=None,
            expose_value=False,
            callback=_setter("json"),
            help="print JSON instead of tables",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def pass_session(f: F) -> F:
    """Call ``f(session, ...)`` with the invocation's Session."""

    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        return ctx.invoke(f, ctx.ensure_object(Session), *args, **kwargs)

    return update_wrapper(wrapper, f)  # type: ignore[return-value]


def translate(exc: BaseException, settings: Settings) -> CliError | None:
    """A failure from the clients as one clear message (None: not ours to translate)."""
    try:
        where = ConnectionSettings.parse(settings.connection_string)
        address = f"{where.host}:{where.port}"
    except ValueError:
        address = "the broker"
    if isinstance(exc, AdminError):
        if exc.status == 401:
            return CliError(f"the broker refused the credentials of the connection string: {exc.detail}")
        return CliError(exc.detail or f"HTTP {exc.status} for /{exc.path}")
    if isinstance(exc, ClientError):
        condition = f" ({exc.condition})" if exc.condition else ""
        return CliError(f"{exc.description}{condition}")
    if isinstance(exc, AmqpClientError):
        return CliError(f"the broker refused the request: {exc}")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return CliError(
            f"cannot verify the HTTPS certificate of {address}: {exc.verify_message}. Pass --ca with the broker's "
            "CA (<data-dir>/tls/ca.pem, printed by `shardbus serve`)."
        )
    if isinstance(exc, TimeoutError):
        return CliError(f"{address} did not answer within {settings.timeout:g} s")
    if isinstance(exc, ConnectionRefusedError):
        return CliError(f"cannot reach the broker at {address}: connection refused (is `shardbus serve` running?)")
    if isinstance(exc, OSError):
        return CliError(f"cannot talk to the broker at {address}: {exc}")
    return None


class ShardbusGroup(click.Group):
    """The root group: one Session per invocation, closed at the end; client failures become CliErrors."""

    def invoke(self, ctx: click.Context) -> Any:
        session = ctx.ensure_object(Session)
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            error = translate(exc, session.settings)
            if error is None:
                raise
            raise error from exc
        finally:
            session.close()
