"""The Service Bus ATOM management API, what ``ServiceBusAdministrationClient`` speaks (``SERVICEBUS_AMQP.md`` §10).

A request's path names a resource (``parse_path``); ``ROUTES`` maps (resource, method) to the operation, which
acts on the namespace the Host header names (the same directory the AMQP side uses). Every request carries a SAS
token for the namespace URL (``https://host:port``) in its Authorization header; a missing or invalid one is 401.
Domain errors answer with their status from ``model.errors.HTTP_STATUS`` and the service's error body
(``<Error><Code/><Detail/></Error>``), so the SDK raises ResourceNotFoundError (404, and 412 on an update of a
missing entity, which carries ``If-Match: *``), ResourceExistsError (409), ClientAuthenticationError (401) or
HttpResponseError with the reason (400, ...).

Operations run on a worker thread (``AdminApi.handle`` is synchronous): they may wait for every partition's store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..access import sas
from ..access.authority import MANAGE, Authority
from ..access.directory import NamespaceDirectory
from ..model.entities import DESCRIPTION_TYPES, EntityKind
from ..model.errors import (
    ArgumentError,
    EntityNotFound,
    PreconditionFailed,
    ShardbusError,
    Unauthorized,
    http_status_of,
)
from ..model.filters import CorrelationFilter, FalseFilter, Rule, SqlFilter, TrueFilter
from ..model.tiers import Tier
from ..namespace import Namespace
from . import atom
from .protocol import HttpRequest, HttpResponse

log = logging.getLogger("shardbus.http.admin")

API_VERSIONS = frozenset({"2024-05", "2021-05", "2017-04"})
ENTRY_TYPE = "application/atom+xml;type=entry;charset=utf-8"
FEED_TYPE = "application/atom+xml;type=feed;charset=utf-8"
XML_TYPE = "application/xml;charset=utf-8"
SUPPLEMENTARY_HEADERS = ("servicebussupplementaryauthorization", "servicebusdlqsupplementaryauthorization")
DEFAULT_PAGE = 100


@dataclass(slots=True)
class Call:
    """One authorized request: its namespace, route parameters and query."""

    request: HttpRequest
    namespace: Namespace
    authority: Authority  # the namespace's shared access rules
    params: dict[str, str]
    query: dict[str, str]

    @property
    def base_url(self) -> str:
        return f"{self.request.scheme}://{self.request.host}"

    @property
    def sb_base(self) -> str:
        return f"sb://{self.request.host}"

    @property
    def is_update(self) -> bool:
        return "if-match" in self.request.headers

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path}"


# ---------------------------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------------------------
def parse_path(path: str) -> tuple[str, dict[str, str]]:
    """(resource kind, parameters) of a request path. The SDK percent-encodes '/' inside names, so segments split
    on literal slashes; a hand-written path with raw slashes in a queue name still works when it names no
    ``subscriptions`` segment."""
    segments = [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
    lower = [s.lower() for s in segments]
    if lower == ["$namespaceinfo"]:
        return "namespace", {}
    if len(lower) == 2 and lower[0] == "$resources":
        return "entities", {"type": lower[1]}
    if not segments:
        raise EntityNotFound("No resource is named by the path '/'.")
    for i in range(len(segments) - 1, 0, -1):
        if lower[i] != "subscriptions":
            continue
        topic, rest = "/".join(segments[:i]), segments[i + 1 :]
        if not rest:
            return "subscriptions", {"topic": topic}
        if len(rest) == 1:
            return "subscription", {"topic": topic, "sub": rest[0]}
        if len(rest) in (2, 3) and rest[1].lower() == "rules":
            if len(rest) == 2:
                return "rules", {"topic": topic, "sub": rest[0]}
            return "rule", {"topic": topic, "sub": rest[0], "rule": rest[2]}
    return "entity", {"name": "/".join(segments)}


def _resource_path(params: dict[str, str]) -> str:
    """The entity path a token must cover for this resource ("" = the namespace itself)."""
    if "topic" in params:
        return params["topic"]
    return params.get("name", "")


# ---------------------------------------------------------------------------------------------------------------
# views and responses
# ---------------------------------------------------------------------------------------------------------------
def _xml(status: int, body: str, content_type: str) -> HttpResponse:
    return HttpResponse(status, atom.document(body), content_type)


def error_response(status: int, detail: str) -> HttpResponse:
    return _xml(status, atom.error_xml(status, detail), XML_TYPE)


def _view(call: Call, desc: Any, path: str, counts: dict[str, int] | None = None) -> atom.EntityView:
    ns = call.namespace
    runtime = ns.get_runtime_properties(path)
    created, updated = ns.created_updated(path)
    limited = runtime.availability == "Limited" or ns.availability(path) == "Limited"
    return atom.EntityView(
        description=desc,
        runtime=runtime,
        created=created,
        updated=updated,
        availability="Limited" if limited else "Available",
        sb_base=call.sb_base,
        max_message_kb=ns.message_size_limits(desc)[0] // 1024,
        counts=counts or {},
    )


def _topic_counts(ns: Namespace, topic: str) -> dict[str, int]:
    counts = {"SubscriptionCount": 0, "SqlFilterCount": 0, "CorrelationFilterCount": 0}
    for sub in ns.list_subscriptions(topic):
        counts["SubscriptionCount"] += 1
        for rule in ns.list_rules(topic, sub.name):
            if isinstance(rule.filter, CorrelationFilter):
                counts["CorrelationFilterCount"] += 1
            elif isinstance(rule.filter, SqlFilter) and not isinstance(rule.filter, TrueFilter | FalseFilter):
                counts["SqlFilterCount"] += 1
    return counts


def _entity_entry(call: Call, kind: EntityKind, desc: Any, root: bool = True) -> str:
    if kind is EntityKind.SUBSCRIPTION:
        path = desc.path
        view = _view(call, desc, path)
    else:
        path = desc.name
        counts = _topic_counts(call.namespace, desc.name) if kind is EntityKind.TOPIC else None
        view = _view(call, desc, path, counts)
    content = atom.description_xml(kind, view)
    return atom.entry_xml(desc.name, call.url(path), view.created, view.updated, call.namespace.name, content, root)


def _rule_entry(call: Call, rule: Rule, root: bool = True) -> str:
    topic, sub = call.params["topic"], call.params["sub"]
    path = f"{topic}/Subscriptions/{sub}"
    created, updated = call.namespace.created_updated(path)
    url = call.url(f"{path}/Rules/{rule.name}")
    content = atom.rule_xml(rule, created)
    return atom.entry_xml(rule.name, url, created, updated, call.namespace.name, content, root)


def _page(call: Call, items: list[Any], entry: Callable[[Any], str], path: str, title: str) -> HttpResponse:
    try:
        skip = int(call.query.get("$skip", "0"))
        top = int(call.query.get("$top", str(DEFAULT_PAGE)))
    except ValueError:
        raise ArgumentError("$skip and $top must be integers.") from None
    if skip < 0 or top < 1:
        raise ArgumentError("$skip must be at least 0 and $top at least 1.")
    items = sorted(items, key=lambda item: item.name.lower())
    page = items[skip : skip + top]
    version = call.query.get("api-version", "2024-05")
    next_url = None
    if skip + top < len(items):
        next_url = f"{call.url(path)}?$skip={skip + top}&$top={top}&api-version={version}"
    entries = [entry(item) for item in page]
    return _xml(200, atom.feed_xml(title, call.url(path), next_url, time.time(), entries), FEED_TYPE)


def _full_replacement(kind: EntityKind, properties: dict[str, Any]) -> dict[str, Any]:
    """An update replaces the description: writable properties it leaves out go back to their defaults."""
    defaults = DESCRIPTION_TYPES[kind](name="defaults")
    attrs = {attr for attr, _codec in atom.WRITABLE[kind].values()}
    changes = {attr: getattr(defaults, attr) for attr in attrs}
    if kind in atom.RULE_HOLDERS:
        changes["authorization_rules"] = []
    changes.update(properties)
    return changes


def _missing_on_update(exc: EntityNotFound) -> PreconditionFailed:
    return PreconditionFailed(f"{exc} An update (If-Match: *) needs an existing entity.")


# ---------------------------------------------------------------------------------------------------------------
# operations
# ---------------------------------------------------------------------------------------------------------------
def get_namespace(call: Call) -> HttpResponse:
    ns = call.namespace
    catalog = ns.root / "catalog.db"
    created = os.stat(catalog).st_ctime if catalog.exists() else time.time()
    premium = ns.tier.tier is Tier.PREMIUM
    content = atom.namespace_info_xml(
        ns.name,
        ns.tier.tier.value.capitalize(),
        created,
        ns.tier.premium_partitions if premium else None,
        ns.tier.partition_count(True),
    )
    body = atom.entry_xml(ns.name, call.url("$namespaceinfo"), created, created, ns.name, content)
    return _xml(200, body, ENTRY_TYPE)


def _lookup(ns: Namespace, name: str) -> tuple[EntityKind, Any]:
    try:
        return EntityKind.QUEUE, ns.get_queue(name)
    except EntityNotFound:
        return EntityKind.TOPIC, ns.get_topic(name)


def get_entity(call: Call) -> HttpResponse:
    kind, desc = _lookup(call.namespace, call.params["name"])
    return _xml(200, _entity_entry(call, kind, desc), ENTRY_TYPE)


def put_entity(call: Call) -> HttpResponse:
    ns, name = call.namespace, call.params["name"]
    parsed = atom.parse_description(call.request.body)
    if parsed.kind is EntityKind.SUBSCRIPTION:
        raise ArgumentError("A SubscriptionDescription belongs under <topic>/subscriptions/<name>.")
    _check_supplementary(call)
    create, update = (
        (ns.create_queue, ns.update_queue) if parsed.kind is EntityKind.QUEUE else (ns.create_topic, ns.update_topic)
    )
    if call.is_update:
        try:
            desc = update(name, **_full_replacement(parsed.kind, parsed.properties))
        except EntityNotFound as exc:
            raise _missing_on_update(exc) from None
        return _xml(200, _entity_entry(call, parsed.kind, desc), ENTRY_TYPE)
    desc = create(name, **parsed.properties)
    return _xml(201, _entity_entry(call, parsed.kind, desc), ENTRY_TYPE)


def delete_entity(call: Call) -> HttpResponse:
    ns, name = call.namespace, call.params["name"]
    kind, _desc = _lookup(ns, name)
    (ns.delete_queue if kind is EntityKind.QUEUE else ns.delete_topic)(name)
    return HttpResponse(200, b"", XML_TYPE)


ENTITY_TYPES: dict[str, tuple[EntityKind, str]] = {
    "queues": (EntityKind.QUEUE, "Queues"),
    "topics": (EntityKind.TOPIC, "Topics"),
}


def list_entities(call: Call) -> HttpResponse:
    found = ENTITY_TYPES.get(call.params["type"])
    if found is None:
        raise ArgumentError(f"Unknown entity type '{call.params['type']}': use queues or topics.")
    kind, title = found
    ns = call.namespace
    items = ns.list_queues() if kind is EntityKind.QUEUE else ns.list_topics()
    path = f"$Resources/{call.params['type']}"
    return _page(call, items, lambda d: _entity_entry(call, kind, d, root=False), path, title)


def get_subscription(call: Call) -> HttpResponse:
    desc = call.namespace.get_subscription(call.params["topic"], call.params["sub"])
    return _xml(200, _entity_entry(call, EntityKind.SUBSCRIPTION, desc), ENTRY_TYPE)


def put_subscription(call: Call) -> HttpResponse:
    ns, topic, sub = call.namespace, call.params["topic"], call.params["sub"]
    parsed = atom.parse_description(call.request.body)
    if parsed.kind is not EntityKind.SUBSCRIPTION:
        raise ArgumentError(f"Expected a SubscriptionDescription for '{topic}/subscriptions/{sub}'.")
    _check_supplementary(call)
    if call.is_update:
        try:
            desc = ns.update_subscription(topic, sub, **_full_replacement(parsed.kind, parsed.properties))
        except EntityNotFound as exc:
            raise _missing_on_update(exc) from None
        return _xml(200, _entity_entry(call, parsed.kind, desc), ENTRY_TYPE)
    desc = ns.create_subscription(topic, sub, default_rule=parsed.default_rule, **parsed.properties)
    return _xml(201, _entity_entry(call, parsed.kind, desc), ENTRY_TYPE)


def delete_subscription(call: Call) -> HttpResponse:
    call.namespace.delete_subscription(call.params["topic"], call.params["sub"])
    return HttpResponse(200, b"", XML_TYPE)


def list_subscriptions(call: Call) -> HttpResponse:
    topic = call.params["topic"]
    items = call.namespace.list_subscriptions(topic)
    entry = lambda d: _entity_entry(call, EntityKind.SUBSCRIPTION, d, root=False)  # noqa: E731
    return _page(call, items, entry, f"{topic}/Subscriptions", "Subscriptions")


def get_rule(call: Call) -> HttpResponse:
    p = call.params
    rule = call.namespace.get_rule(p["topic"], p["sub"], p["rule"])
    return _xml(200, _rule_entry(call, rule), ENTRY_TYPE)


def put_rule(call: Call) -> HttpResponse:
    ns, p = call.namespace, call.params
    rule = atom.parse_rule(call.request.body, p["rule"])  # parsed (and its SQL compiled) before anything changes
    if not call.is_update:
        ns.create_rule(p["topic"], p["sub"], rule)
        return _xml(201, _rule_entry(call, rule), ENTRY_TYPE)
    try:
        rule = ns.update_rule(p["topic"], p["sub"], rule)  # in place: the rule keeps its position
    except EntityNotFound as exc:
        raise _missing_on_update(exc) from None
    return _xml(200, _rule_entry(call, rule), ENTRY_TYPE)


def delete_rule(call: Call) -> HttpResponse:
    p = call.params
    call.namespace.delete_rule(p["topic"], p["sub"], p["rule"])
    return HttpResponse(200, b"", XML_TYPE)


def list_rules(call: Call) -> HttpResponse:
    p = call.params
    items = call.namespace.list_rules(p["topic"], p["sub"])
    path = f"{p['topic']}/Subscriptions/{p['sub']}/Rules"
    return _page(call, items, lambda r: _rule_entry(call, r, root=False), path, "Rules")


ROUTES: dict[tuple[str, str], Callable[[Call], HttpResponse]] = {
    ("namespace", "GET"): get_namespace,
    ("entities", "GET"): list_entities,
    ("entity", "GET"): get_entity,
    ("entity", "PUT"): put_entity,
    ("entity", "DELETE"): delete_entity,
    ("subscriptions", "GET"): list_subscriptions,
    ("subscription", "GET"): get_subscription,
    ("subscription", "PUT"): put_subscription,
    ("subscription", "DELETE"): delete_subscription,
    ("rules", "GET"): list_rules,
    ("rule", "GET"): get_rule,
    ("rule", "PUT"): put_rule,
    ("rule", "DELETE"): delete_rule,
}


# ---------------------------------------------------------------------------------------------------------------
# authorization and the entry point
# ---------------------------------------------------------------------------------------------------------------
def _check_supplementary(call: Call) -> None:
    """Forwarding requests carry tokens for their targets; when present they must be valid too."""
    for header in SUPPLEMENTARY_HEADERS:
        token = call.request.headers.get(header)
        if token:
            call.authority.validate(token)


class AdminApi:
    """The ATOM API over a ``NamespaceDirectory``; ``handle`` is synchronous (run it on a worker thread)."""

    def __init__(self, directory: NamespaceDirectory) -> None:
        self.directory = directory

    def handle(self, request: HttpRequest) -> HttpResponse:
        try:
            return self._handle(request)
        except ShardbusError as exc:
            return error_response(http_status_of(exc), str(exc) or type(exc).__name__)
        except Exception as exc:  # a bug must not take the connection down: answer 500 with what happened
            log.exception("admin request %s %s failed", request.method, request.target)
            return error_response(500, f"Internal error: {type(exc).__name__}: {exc}")

    def _handle(self, request: HttpRequest) -> HttpResponse:
        split = urlsplit(request.target)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        version = query.get("api-version")
        if version is not None and version not in API_VERSIONS:
            raise ArgumentError(
                f"The api-version '{version}' is not supported: use {', '.join(sorted(API_VERSIONS, reverse=True))}."
            )
        kind, params = parse_path(split.path)
        operation = ROUTES.get((kind, request.method))
        if operation is None:
            return error_response(405, f"{request.method} is not supported on {split.path}.")
        namespace, authority = self.directory.resolve(request.host)
        self._authorize(request, authority, _resource_path(params))
        return operation(Call(request, namespace, authority, params, query))

    @staticmethod
    def _authorize(request: HttpRequest, authority: Authority, path: str) -> None:
        header = request.headers.get("authorization")
        if not header:
            raise Unauthorized(
                "MissingToken: the request has no Authorization header. Send a SharedAccessSignature token for "
                "the namespace (audience https://<host>:<port>) with Manage rights."
            )
        claims = authority.validate(header)
        if not sas.covers(claims, path):
            raise Unauthorized(
                f"InvalidAudience: the token for '{claims.resource}' does not grant access to '/{path}'. Use a token "
                "for the namespace URL."
            )
        if MANAGE not in claims.rights:  # the service's answer, reads included (SAS docs; 401 as it answers)
            raise Unauthorized(
                f"Manage,EntityRead claims required for this operation. The rule '{claims.key_name}' grants "
                f"{', '.join(sorted(r.value for r in claims.rights)) or 'nothing'}."
            )
