"""``$management`` requests with made-up bodies (every operation, its real field names with values of any AMQP type,
and names it does not know), many per connection: each gets a reply with a status the service uses (never 500,
never silence), and the same link pair answers the next one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fuzz_wire import still_serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from management_wire import management
from shardbus.amqp.types import Array, Int, Long, Symbol
from shardbus.endpoint.management import OPERATIONS

FIELDS = [
    "from-sequence-number",
    "message-count",
    "lock-tokens",
    "sequence-numbers",
    "receiver-settle-mode",
    "disposition-status",
    "deadletter-reason",
    "deadletter-description",
    "messages",
    "session-id",
    "session-state",
    "skip",
    "top",
    "last-updated-time",
    "rule-name",
    "rule-description",
    "from",
    "to",
    "partition",
    "marks",
    "columns",
]
STATUSES = {200, 204, 400, 401, 403, 404, 409, 410, 412, 503}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 20).map(Long),
    st.integers(-(2**31), 2**31 - 1).map(Int),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=10).map(Symbol),
    st.binary(max_size=20),
    st.uuids(),
    st.datetimes(timezones=st.just(UTC), min_value=datetime(1, 1, 2)),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), children, max_size=4),
        st.lists(st.integers(0, 9).map(Long), max_size=3).map(lambda v: Array(Long, v)),
        st.lists(st.uuids(), max_size=3).map(lambda v: Array(uuid.UUID, v)),
    ),
    max_leaves=8,
)
bodies = st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), values, max_size=5)
operations = st.one_of(st.sampled_from(sorted(OPERATIONS)), st.just("com.microsoft:nothing"))


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    node=st.sampled_from(["fuzzq", "fuzzs", "fuzzt/Subscriptions/s1"]),
    requests=st.lists(st.tuples(operations, bodies), min_size=1, max_size=25),
)
def test_made_up_management_bodies(fuzz_broker, node, requests):
    ns = fuzz_broker.namespace
    if "fuzzt" not in {t.name for t in ns.list_topics()}:
        ns.create_topic("fuzzt")
        ns.create_subscription("fuzzt", "s1")
    replies = management(fuzz_broker.server.port, node, requests)
    assert len(replies) == len(requests)
    for (operation, body), reply in zip(requests, replies, strict=True):
        assert reply.status in STATUSES, (operation, body, reply)
        if reply.status >= 400:
            assert reply.condition is not None and reply.description, (operation, body, reply)
    still_serving(fuzz_broker.server.port)
