"""A running broker: namespaces opened from a data directory, served over AMQP on one port.

The same port serves HTTPS (the admin client's ATOM API) and plain HTTP (``GET /health``): the listener tells
them apart by the first byte. TLS uses a local CA kept at ``<data-dir>/tls/ca.pem`` (created on first start),
or the certificate and key given as ``tls_cert``/``tls_key``.

``Broker`` runs in the foreground (``serve_forever``, used by ``shardbus serve``) or on a background thread
(``start``/``stop``, used by tests and embedding applications). Stopping closes the listener first, then every
namespace, which waits for queued writes: everything acknowledged is on disk when ``stop`` returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .access.directory import NamespaceDirectory
from .endpoint.limits import ACCEPT_SLACK, DEFAULT_LIMITS, ConnectionLimits
from .http.app import HttpFrontend
from .http.tls import TlsFiles, ensure_certificates, own_certificate
from .listener import AmqpServer
from .model.authorization import AuthorizationRule
from .namespace import DEFAULT_NAMESPACE, Namespace
from .runtime import new_event_loop, tune_garbage_collector
from .store.amqp_values import register_stored_types

if TYPE_CHECKING:
    from .cluster.placement import MetadataCluster
    from .cluster.supervisor import LocalCluster

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"
log = logging.getLogger("shardbus")


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit (RLIMIT_NOFILE) towards ``wanted``, as far as the hard limit allows:
    every connection is a file descriptor. Returns the soft limit in force; warns when it stays below ``wanted``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open-file limit %d is below the %d that --max-connections needs; raise it (ulimit -n) or lower "
            "--max-connections",
            soft,
            wanted,
        )
    return soft


def connection_string(host: str, port: int, key: str) -> str:
    """What clients of a broker listening on ``host:port`` with ``key`` connect with."""
    host = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::", "::1") else host
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={DEFAULT_KEY_NAME};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true"
    )


class Broker:
    def __init__(
        self,
        data_dir: Path | str = "./shardbus-data",
        host: str = "127.0.0.1",
        port: int = 5672,
        key: str = DEFAULT_KEY,
        namespace: str = DEFAULT_NAMESPACE,
        config: Path | str | dict[str, Any] | None = None,
        extra_namespaces: dict[str, dict[str, Any]] | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
        tls_hosts: list[str] | tuple[str, ...] = (),
        workers: int = 0,
        metadata: str | None = None,
        cluster: Any = None,
        reuse_port: bool = False,
        fork_workers: bool = False,
        max_connections: int = DEFAULT_LIMITS.max_connections,
        idle_timeout: float | None = DEFAULT_LIMITS.idle_timeout,
        limits: ConnectionLimits | None = None,
        **namespace_options: Any,
    ) -> None:
        """``namespace_options`` open the default namespace (tier, premium_partitions, quotas);
        ``extra_namespaces`` maps more namespace names to their options. Clients pick a namespace by the host
        name they connect with (its first label); localhost and bare IP addresses get the default one.
        ``tls_cert``/``tls_key``: the HTTPS certificate chain and key to use instead of the local CA's;
        ``tls_hosts``: more host names for the local CA's server certificate. ``workers``: run the partition
        brokers in that many worker processes (0: in this process). ``cluster``: instead, workers another process
        runs, already linked (``cluster.attached.AttachedCluster``; closed with the broker). ``reuse_port``: share
        the port with other front ends (SO_REUSEPORT). ``fork_workers``: start the workers by forking this process
        (fast; only where nothing else is open yet: ``shardbus serve``). ``max_connections``: AMQP connections
        served at once; ``idle_timeout``: seconds of silence announced to clients (the broker closes after twice
        that; None: never); ``limits``: every connection limit at once (endpoint/limits.py), instead of those."""
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        register_stored_types()  # before any store opens or worker forks: messages' AMQP value types
        if limits is None:
            limits = ConnectionLimits(max_connections=max_connections, idle_timeout=idle_timeout or None)
        self.limits = limits
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.key = key
        self.default_namespace = namespace
        self.namespaces: dict[str, Namespace] = {}
        self.cluster: LocalCluster | MetadataCluster | None = None
        configs: list[Any] = []
        if config is not None:
            from .config import load_config

            configs = load_config(config)  # validated whole before anything is opened
        try:
            if cluster is not None:  # a front end of ``serve --frontends M`` (frontends.py)
                self.cluster = cluster
                namespace_options["partition_factory"] = cluster.partition
            elif workers > 0:
                from .cluster.supervisor import LocalCluster  # only multi-process brokers pay for it

                clock = namespace_options.get("clock", time.time)
                self.cluster = LocalCluster(self.data_dir, workers, key, clock=clock, fork=fork_workers).start()
                namespace_options["partition_factory"] = self.cluster.partition
            elif metadata is not None:
                # ``metadata``: a PostgreSQL DSN; partitions run on the workers registered there (any host)
                from .cluster.placement import MetadataCluster

                clock = namespace_options.get("clock", time.time)
                self.cluster = MetadataCluster(metadata, self.data_dir, key, clock=clock).start()
                namespace_options["partition_factory"] = self.cluster.partition
            shared = ("partition_factory", "clock", "remove_orphans")
            opened = {k: v for k, v in namespace_options.items() if k in shared}
            for cfg in configs:
                ns = Namespace.open(
                    self.data_dir, name=cfg.name, tier=cfg.tier, premium_partitions=cfg.premium_partitions, **opened
                )
                self.namespaces[cfg.name] = ns
                from .config import apply_config

                apply_config(ns, cfg)
            if configs and namespace == DEFAULT_NAMESPACE and DEFAULT_NAMESPACE not in self.namespaces:
                self.default_namespace = configs[0].name
            for name, options in (extra_namespaces or {}).items():
                if name not in self.namespaces:
                    self.namespaces[name] = Namespace.open(self.data_dir, name=name, **opened, **options)
            if self.default_namespace not in self.namespaces:
                self.namespaces[self.default_namespace] = Namespace.open(
                    self.data_dir, name=self.default_namespace, **namespace_options
                )
        except BaseException:
            self._close_namespaces()
            raise
        tune_garbage_collector()
        root = AuthorizationRule(DEFAULT_KEY_NAME, key, "", ("Manage", "Send", "Listen"))
        configured = {cfg.name: cfg.authorization_rules for cfg in configs}
        rules: dict[str, dict[str, str] | list[AuthorizationRule]] = {
            name: [root, *configured.get(name, [])] for name in self.namespaces
        }
        self.directory = NamespaceDirectory(self.namespaces, self.default_namespace, rules)
        try:
            if tls_cert is not None and tls_key is not None:
                self.tls: TlsFiles = own_certificate(tls_cert, tls_key)
            else:
                self.tls = ensure_certificates(self.data_dir, [host, *tls_hosts])
            context = self.tls.server_context()
        except BaseException:
            self._close_namespaces()
            raise
        self.http = HttpFrontend(self.directory)
        self.server = AmqpServer(
            self.directory, host, port, http=self.http, tls=context, reuse_port=reuse_port, limits=limits
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    @property
    def namespace(self) -> Namespace:
        return self.namespaces[self.default_namespace]

    @property
    def ca_path(self) -> Path | None:
        """The local CA certificate HTTPS clients should trust (None with a certificate of the user's own)."""
        return self.tls.ca

    @property
    def connection_string(self) -> str:
        return connection_string(self.host, self.server.port, self.key)

    # --- background mode ------------------------------------------------------------------------------------
    def start(self) -> Broker:
        """Serve on a background thread; returns once the port is listening."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.stop())
            self._close_namespaces()  # queued writes finish while the loop can still take their callbacks
            loop.close()

        self._thread = threading.Thread(target=run, name="shardbus-amqp", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._close_namespaces()
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None
        self._close_namespaces()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_namespaces(self) -> None:
        http = getattr(self, "http", None)
        if http is not None:
            http.close()  # running management operations finish before their namespace closes
        for ns in self.namespaces.values():
            ns.close()  # idempotent
        if self.cluster is not None:
            self.cluster.close()  # after the namespaces: their partitions were stopped (flushed) first
            self.cluster = None

    # --- foreground mode ------------------------------------------------------------------------------------
    def serve_forever(self, on_ready: Any = None) -> None:
        """Serve until SIGINT or SIGTERM, then stop cleanly."""
        raise_file_limit(self.limits.max_connections + ACCEPT_SLACK + 256)  # + stores, logs, worker links
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()

        async def main() -> None:
            await self.server.start()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if on_ready is not None:
                on_ready(self)
            await stop.wait()
            await self.server.stop()

        try:
            loop.run_until_complete(main())
        finally:
            self._close_namespaces()  # before the loop closes: late commit callbacks still have a loop
            loop.close()
