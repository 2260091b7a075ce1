"""A real broker per module for the admin-client tests, reached over HTTPS on its AMQP port.

The admin client verifies the broker's certificate against the local CA the broker created in its data directory
(``connection_verify=<ca.pem>``), exactly as users are told to.
"""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture
def ns(broker):
    return broker.namespace


@pytest.fixture
def ca(broker) -> str:
    return str(broker.ca_path)


@pytest.fixture
def name():
    """Factory: a new unique entity name with a prefix."""

    def make(prefix: str = "e") -> str:
        return f"{prefix}{next(_names)}"

    return make
