"""A real broker per module for the admin-client tests, reached over HTTPS on its AMQP port.

The admin client verifies the broker's certificate against the local CA the broker created in its data directory
(``connection_verify=<ca.pem>``), exactly as users are told to.
"""

from __future__ import annotations

import itertools

import pytest

from shardbus.server import Broker

_names = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0).start()
    yield b
    b.stop()


@pytest.fixture
def ns(broker):
    return broker.namespace


@pytest.fixture
def conn_str(broker) -> str:
    return broker.connection_string


@pytest.fixture
def ca(broker) -> str:
    return str(broker.ca_path)


@pytest.fixture
def name():
    """Factory: a new unique entity name with a prefix."""

    def make(prefix: str = "e") -> str:
        return f"{prefix}{next(_names)}"

    return make
