"""The ATOM XML management API with made-up request bodies, over HTTPS: descriptions with the real element names
holding values of any shape, mutated entries, text that is not XML, entity expansion bombs. Every request gets an
answer with a status the service uses for bad requests (never 500), on a connection that goes on, and the broker
keeps serving the admin API and AMQP clients."""

from __future__ import annotations

import http.client
import ssl
import xml.sax.saxutils

from fuzz_wire import still_serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardbus.access.sas import generate_token
from shardbus.http.atom import WRITABLE
from shardbus.model.entities import EntityKind
from shardbus.server import DEFAULT_KEY_NAME

STATUSES = {200, 201, 400, 401, 403, 404, 405, 409, 413}
ELEMENTS = sorted({name for table in WRITABLE.values() for name in table} | {"MessageCount", "CountDetails"})
KINDS = {EntityKind.QUEUE: "QueueDescription", EntityKind.TOPIC: "TopicDescription"}
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"


def _entry(description: str, inner: str) -> str:
    return (
        '<?xml version="1.0" encoding="utf-8"?><entry xmlns="http://www.w3.org/2005/Atom">'
        f'<content type="application/xml"><{description} xmlns="{SB}">{inner}</{description}></content></entry>'
    )


texts = st.one_of(
    st.sampled_from(["", "true", "false", "PT1M", "P10675199DT2H48M5.4775807S", "-1", "0", "1024", "102400", "x"]),
    st.integers(-(2**70), 2**70).map(str),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
)
elements = st.tuples(st.sampled_from(ELEMENTS), texts).map(
    lambda e: f"<{e[0]}>{xml.sax.saxutils.escape(e[1])}</{e[0]}>"
)
descriptions = st.builds(
    lambda kind, inner: _entry(kind, "".join(inner)),
    st.sampled_from([*KINDS.values(), "SubscriptionDescription", "RuleDescription", "Nothing"]),
    st.lists(elements, max_size=8),
)
mutated = st.builds(
    lambda text, cut, junk: text[:cut] + junk + text[cut:],
    descriptions,
    st.integers(0, 400),
    st.sampled_from(["<", "&", "]]>", "<!--", "\x00", "<entry>", '"', "&#0;", "&lol;"]),
)
BOMB = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
    '<!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;"><!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;'
    '&lol2;&lol2;&lol2;"><!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>'
    '<entry xmlns="http://www.w3.org/2005/Atom"><content><QueueDescription>&lol4;</QueueDescription></content></entry>'
)
bodies = st.one_of(descriptions, mutated, st.text(max_size=200), st.just(BOMB))


def _connection(broker) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(broker.ca_path))
    return http.client.HTTPSConnection("localhost", broker.server.port, context=context, timeout=10)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(["PUT", "PUT", "PUT", "GET", "DELETE"]), st.sampled_from(["fz", "fz/sub", "fz%2Fx"]), bodies
        ),
        min_size=1,
        max_size=6,
    )
)
def test_made_up_atom_requests(fuzz_broker, requests):
    port = fuzz_broker.server.port
    auth = {
        "Authorization": generate_token(f"https://localhost:{port}", DEFAULT_KEY_NAME, fuzz_broker.key),
        "Content-Type": "application/atom+xml",
    }
    conn = _connection(fuzz_broker)
    try:
        for method, path, body in requests:
            conn.request(
                method, f"/{path}?api-version=2021-05", body=body.encode("utf-8", "surrogatepass"), headers=auth
            )
            response = conn.getresponse()
            answer = response.read()
            assert response.status in STATUSES, (method, path, body, response.status, answer[:300])
        conn.request("GET", "/fuzzq?api-version=2021-05", headers=auth)  # the same connection goes on
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()


def test_still_serving_after_the_atom_fuzz(fuzz_broker):
    still_serving(fuzz_broker.server.port)
