"""AMQP transactions checked by another implementation: python-qpid-proton's client declares, sends inside
the transaction, and commits or aborts."""

from __future__ import annotations

import pytest

proton = pytest.importorskip("proton")

from proton import Message as ProtonMessage  # noqa: E402
from proton.handlers import MessagingHandler, TransactionHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402


class TransactionalSender(MessagingHandler, TransactionHandler):
    def __init__(self, url: str, queue: str, bodies: list[str], commit: bool) -> None:
        super().__init__()
        self.url, self.queue, self.bodies, self.commit = url, queue, bodies, commit
        self.result: str | None = None

    def on_start(self, event):
        self.connection = event.container.connect(
            self.url,
            user="RootManageSharedAccessKey",
            password="SAS_KEY_VALUE",
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
        )
        self.sender = event.container.create_sender(self.connection, self.queue)
        event.container.declare_transaction(self.connection, handler=self)
        self.timer = event.container.schedule(20, self)  # a safety stop if the broker never answers

    def finish(self, result: str) -> None:
        self.result = self.result or result
        self.timer.cancel()
        self.connection.close()

    def on_timer_task(self, event):
        self.finish("timeout")

    def on_transaction_declared(self, event):
        for body in self.bodies:
            event.transaction.send(self.sender, ProtonMessage(body=body, annotations={"x-opt-partition-key": "k"}))
        if self.commit:
            event.transaction.commit()
        else:
            event.transaction.abort()

    def on_transaction_committed(self, event):
        self.finish("committed")

    def on_transaction_aborted(self, event):
        self.finish("aborted")

    def on_transaction_declare_failed(self, event):
        self.finish("declare failed")

    def on_transaction_commit_failed(self, event):
        self.finish("commit failed")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_proton_commits_a_transaction(broker, ns, queue, partitioned):
    q = queue(enable_partitioning=partitioned)
    handler = TransactionalSender(f"amqp://127.0.0.1:{broker.server.port}", q, ["a", "b", "c"], commit=True)
    Container(handler).run()
    assert handler.result == "committed"
    assert ns.get_runtime_properties(q).active_message_count == 3


@pytest.mark.timeout(60)
def test_proton_aborts_a_transaction(broker, ns, queue):
    q = queue(enable_partitioning=True)
    handler = TransactionalSender(f"amqp://127.0.0.1:{broker.server.port}", q, ["x", "y"], commit=False)
    Container(handler).run()
    assert handler.result == "aborted"
    assert ns.get_runtime_properties(q).total_message_count == 0
