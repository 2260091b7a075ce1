"""The fuzz tests' fixtures: the recorded SDK sessions, re-signed (``fuzz_wire.resign``); a broker with the
entities the recordings use; and, around every test, no ERROR log line and no traceback from the broker."""

from __future__ import annotations

import logging

import pytest
from fuzz_wire import CORPUS, resign, split_frames


@pytest.fixture(scope="session")
def corpus() -> dict[str, list[bytes]]:
    """Each recorded SDK session (re-signed), as its list of headers and frames."""
    return {p.stem: split_frames(resign(p.read_bytes())) for p in sorted(CORPUS.glob("*.bin"))}


@pytest.fixture(scope="module")
def fuzz_broker(broker):
    """The module's broker with the entities the recordings use."""
    ns = broker.namespace
    for name, session in (("fuzzq", False), ("fuzzs", True)):
        if name not in {q.name for q in ns.list_queues()}:
            ns.create_queue(name, requires_session=session)
    return broker


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def no_error_logs():
    """Fails the test if anything (the broker, asyncio) logged an ERROR or a traceback while it ran."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler.records
    root.removeHandler(handler)
    bad = [r for r in handler.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in bad[:5])
