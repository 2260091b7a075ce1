"""The shardbus pytest plugin: a real Service Bus broker for test suites, in-process, reset before every test.

Installed with the package and registered through the ``pytest11`` entry point, so ``pip install shardbus``
is all a test suite needs. Fixtures (all start the broker on first use only; a session that uses none of them
starts nothing and imports nothing of shardbus):

``shardbus_connection_string`` (function scope)
    The connection string of the in-process broker, for ``ServiceBusClient.from_connection_string`` and
    ``ServiceBusAdministrationClient.from_connection_string``. Before the test runs the namespace is reset: every
    queue and topic (with its subscriptions, rules, messages, sessions and duplicate-detection history) that an
    earlier test created is deleted, so each test starts from an empty namespace (or from exactly the entities of
    ``shardbus_config``, freshly created and empty).
``shardbus_namespace`` (function scope)
    The broker's default :class:`shardbus.Namespace` after the same reset: create entities directly
    (``create_queue``, ``create_topic``, ``create_subscription``, ``create_rule``), look at messages, or inject
    faults (``namespace.faults``) without going through the network.
``shardbus_ca_path`` (session scope)
    The path (a string) of the broker's local CA certificate, for the admin client's ``connection_verify``.
``shardbus_broker`` (session scope)
    The running :class:`shardbus.server.Broker` itself (``data_dir``, ``port``, ``namespaces``). Started once per
    session (per worker with pytest-xdist) on a free port of 127.0.0.1, with its data in a pytest temporary
    directory; stopped at the end of the session.

Options (``pytest.ini`` / ``pyproject.toml`` ``[tool.pytest.ini_options]``, or the command line):

``shardbus_config`` / ``--shardbus-config PATH``
    An emulator ``Config.json`` (relative paths are relative to the rootdir), applied at start and again after
    every reset, so the entities it names exist, empty, in every test.
``shardbus_reset`` / ``--shardbus-reset {entities,none}``
    ``entities`` (the default) deletes every queue and topic before each test; ``none`` keeps everything between
    tests, as the official emulator does (useful to look at what a failing sequence of tests left behind).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from shardbus.namespace import Namespace
    from shardbus.server import Broker

RESET_MODES = ("entities", "none")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardbus", "shardbus: an in-process Azure Service Bus for tests")
    group.addoption(
        "--shardbus-config",
        dest="shardbus_config",
        default=None,
        metavar="PATH",
        help="emulator Config.json whose entities exist (empty) in every test using the shardbus fixtures",
    )
    group.addoption(
        "--shardbus-reset",
        dest="shardbus_reset",
        default=None,
        choices=RESET_MODES,
        help="before each test: delete every queue and topic ('entities', the default) or keep them ('none')",
    )
    parser.addini("shardbus_config", "emulator Config.json applied at start and after every reset", default="")
    parser.addini(
        "shardbus_reset", "per-test reset of the shardbus namespace: entities (default) or none", default="entities"
    )


def _option(config: pytest.Config, name: str) -> str:
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


class _Session:
    """The session's broker plus what a reset needs (the parsed config, applied again after each reset)."""

    def __init__(self, config: pytest.Config, data_dir: Path) -> None:
        import gc

        from shardbus.server import Broker

        reset = _option(config, "shardbus_reset") or "entities"
        if reset not in RESET_MODES:
            raise pytest.UsageError(f"shardbus_reset must be one of {', '.join(RESET_MODES)}, not {reset!r}")
        self.reset_mode = reset
        self.configs: list[Any] = []
        config_path: Path | None = None
        source = _option(config, "shardbus_config")
        if source:
            from shardbus.config import load_config

            config_path = Path(source)
            if not config_path.is_absolute():
                config_path = Path(config.rootpath) / config_path
            self.configs = load_config(config_path)
        started = time.perf_counter()
        threshold = gc.get_threshold()
        # port 0: a free port chosen by the system; the connection string names it.
        self.broker: Broker = Broker(data_dir=data_dir, host="127.0.0.1", port=0, config=config_path)
        self.broker.start()
        # The broker tunes the garbage collector for a long-running server; give the test process its own back.
        gc.set_threshold(*threshold)
        gc.unfreeze()
        self.start_seconds = time.perf_counter() - started
        self.reset_seconds: list[float] = []

    def reset(self) -> None:
        """Delete every queue and topic of every namespace, then create the configured entities again."""
        if self.reset_mode == "none":
            return
        started = time.perf_counter()
        for ns in self.broker.namespaces.values():
            _clear(ns)
        if self.configs:
            from shardbus.config import apply_config

            for cfg in self.configs:
                apply_config(self.broker.namespaces[cfg.name], cfg)
        self.reset_seconds.append(time.perf_counter() - started)


def _clear(ns: Namespace) -> None:
    """Delete every queue and topic; partitions a test left stopped or blocked (``ns.faults``) are restored first."""
    ns.faults.blocked.clear()
    doomed = [(t.name, ns.delete_topic) for t in ns.list_topics()] + [
        (q.name, ns.delete_queue) for q in ns.list_queues()
    ]
    for name, delete in doomed:
        for p in ns._sender_entity(name).partitions:
            if not p.healthy:
                ns.faults.restore_partition(name, p.id)
        delete(name)


_SESSION_KEY = pytest.StashKey["_Session"]()


@pytest.fixture(scope="session")
def _shardbus_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    session = _Session(request.config, tmp_path_factory.mktemp("shardbus"))
    request.config.stash[_SESSION_KEY] = session
    try:
        yield session
    finally:
        session.broker.stop()


@pytest.fixture(scope="session")
def shardbus_broker(_shardbus_session: _Session) -> Broker:
    """The session's in-process shardbus broker (``shardbus.server.Broker``), started on first use on a free
    port of 127.0.0.1 with its data in a temporary directory. Not reset by itself: use
    ``shardbus_connection_string`` or ``shardbus_namespace`` for a clean namespace per test."""
    return _shardbus_session.broker


@pytest.fixture(scope="session")
def shardbus_ca_path(shardbus_broker: Broker) -> str:
    """The broker's local CA certificate: ``connection_verify=`` for ``ServiceBusAdministrationClient``."""
    return str(shardbus_broker.ca_path)


@pytest.fixture
def _shardbus_clean(_shardbus_session: _Session) -> Broker:
    _shardbus_session.reset()
    return _shardbus_session.broker


@pytest.fixture
def shardbus_connection_string(_shardbus_clean: Broker) -> str:
    """Connection string of an in-process shardbus whose namespace is empty when the test starts: every queue
    and topic earlier tests created is deleted (the entities of ``shardbus_config`` are created again, empty).
    Works with ``ServiceBusClient`` and, with ``connection_verify=shardbus_ca_path``, the admin client."""
    return _shardbus_clean.connection_string


@pytest.fixture
def shardbus_namespace(_shardbus_clean: Broker) -> Namespace:
    """The broker's default ``shardbus.Namespace``, reset like ``shardbus_connection_string`` (one reset per
    test when both are used): create entities for the test with ``create_queue``, ``create_topic``, ..."""
    return _shardbus_clean.namespace


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is None or config.getoption("verbose") < 1:
        return
    resets = session.reset_seconds
    line = f"shardbus: started in {session.start_seconds * 1000:.0f} ms"
    if resets:
        mean_ms, max_ms = sum(resets) / len(resets) * 1000, max(resets) * 1000
        line += f"; {len(resets)} resets, mean {mean_ms:.1f} ms, max {max_ms:.1f} ms"
    terminalreporter.write_line(line)
