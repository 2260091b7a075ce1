"""The ATOM management API over HTTPS, from the command's side: the requests ``ServiceBusAdministrationClient``
sends, with a SAS token for the namespace URL (``https://host:port``) made from the connection string.

Request bodies and parsed responses use the broker's own mapping (``http/atom.py``: the per-kind table of
writable properties and their codecs, the rule XML, the description parser), so the command and the server can
never disagree on an element. Only the read-only parts of a response (counts, availability, times), which the
server writes and never reads, are parsed here.
"""

from __future__ import annotations

import http.client
import ssl
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ..access import sas
from ..client import ConnectionSettings
from ..http import atom
from ..model.entities import EntityKind
from ..model.filters import Rule

API_VERSION = "2021-05"
PAGE = 100  # entries per list request ($top)


class AdminError(Exception):
    """The management API answered with an error status; ``detail`` is the service's reason."""

    def __init__(self, status: int, detail: str, path: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.path = path


@dataclass(slots=True)
class EntityInfo:
    """A queue, topic or subscription as a GET returns it."""

    kind: EntityKind
    name: str
    properties: dict[str, Any]  # writable properties by description attribute (lock_duration, ...)
    runtime: dict[str, Any] = field(default_factory=dict)  # read-only values by element name (SizeInBytes, ...)

    def count(self, element: str) -> int:
        try:
            return int(self.runtime.get(element) or 0)
        except ValueError:
            return 0


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(element: ET.Element, name: str) -> list[ET.Element]:
    return [child for child in element if _local(child.tag) == name]


def _description_element(entry: ET.Element) -> ET.Element | None:
    content = _children(entry, "content")
    return content[0][0] if content and len(content[0]) else None


def read_only_values(description: ET.Element, kind: EntityKind) -> dict[str, Any]:
    """The elements a description carries besides its writable properties, by element name; ``CountDetails``
    is flattened to its counts (ActiveMessageCount, DeadLetterMessageCount, ...)."""
    writable = atom.WRITABLE[kind]
    values: dict[str, Any] = {}
    for child in description:
        name = _local(child.tag)
        if name in writable:
            continue
        if name == "CountDetails":
            for count in child:
                values[_local(count.tag)] = (count.text or "").strip()
        elif len(child) == 0:
            values[name] = (child.text or "").strip()
    return values


def entity_from_entry(entry: ET.Element) -> EntityInfo:
    """One ``<entry>`` (a GET's body or a feed's item) to an EntityInfo, parsed by atom.parse_description."""
    parsed = atom.parse_description(ET.tostring(entry))
    description = _description_element(entry)
    title = _children(entry, "title")
    name = (title[0].text or "") if title else ""
    runtime = read_only_values(description, parsed.kind) if description is not None else {}
    return EntityInfo(parsed.kind, name, parsed.properties, runtime)


def rule_from_entry(entry: ET.Element) -> Rule:
    title = _children(entry, "title")
    return atom.parse_rule(ET.tostring(entry), (title[0].text or "") if title else "")


def description_request(kind: EntityKind, properties: dict[str, Any], default_rule: Rule | None = None) -> bytes:
    """A PUT body for a queue, topic or subscription with exactly ``properties`` (description attribute names):
    the elements in the SDK's order, each value written by the broker's own codec for it."""
    table = atom.WRITABLE[kind]
    by_attr = {attr: (element, codec) for element, (attr, codec) in table.items()}
    rules = properties.get("authorization_rules") if kind in atom.RULE_HOLDERS else None
    unknown = set(properties) - set(by_attr) - ({"authorization_rules"} if kind in atom.RULE_HOLDERS else set())
    if unknown:
        raise ValueError(f"not a {kind.value} property: {', '.join(sorted(unknown))}")
    parts = []
    for element in atom.ORDER[kind]:
        if element == "AuthorizationRules" and rules:  # kept through an update (it replaces the description)
            parts.append(atom.authorization_rules_xml(rules))
            continue
        entry = table.get(element)
        if entry is None or entry[0] not in properties or properties[entry[0]] is None:
            continue
        value = entry[1].format(properties[entry[0]])
        parts.append(f"<{element}>{_xml_text(value)}</{element}>")
    if default_rule is not None:
        parts.append(atom.rule_xml(default_rule, 0, element="DefaultRuleDescription"))
    element_name = atom.ELEMENT_OF_KIND[kind]
    inner = f'<{element_name} xmlns="{atom.SB_NS}" xmlns:i="{atom.XSI_NS}">{"".join(parts)}</{element_name}>'
    return _entry(inner)


def rule_request(rule: Rule) -> bytes:
    import time

    return _entry(atom.rule_xml(rule, time.time()))


def _entry(content: str) -> bytes:
    return atom.document(f'<entry xmlns="{atom.ATOM_NS}"><content type="application/xml">{content}</content></entry>')


def _xml_text(text: str) -> str:
    from xml.sax.saxutils import escape

    return escape(text)


def _segment(name: str) -> str:
    return quote(name, safe="")


def entity_path(name: str) -> str:
    return "/".join(_segment(part) for part in name.split("/"))  # queue names may hold '/': keep them as path


def subscription_path(topic: str, subscription: str | None = None) -> str:
    base = f"{entity_path(topic)}/Subscriptions"
    return base if subscription is None else f"{base}/{_segment(subscription)}"


def rule_path(topic: str, subscription: str, rule: str | None = None) -> str:
    base = f"{subscription_path(topic, subscription)}/Rules"
    return base if rule is None else f"{base}/{_segment(rule)}"


class AdminClient:
    """Blocking HTTPS requests to the broker's ATOM API (one connection, reopened when the server closes it)."""

    def __init__(self, settings: ConnectionSettings, ca: str | None, timeout: float = 30.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        self.audience = f"https://{settings.host}:{settings.port}"
        self._conn: http.client.HTTPSConnection | None = None

    # ------------------------------------------------------------------------------------------ entities
    def get_entity(self, name: str) -> EntityInfo:
        """A queue or topic (whichever the name is)."""
        return entity_from_entry(self._entry("GET", entity_path(name)))

    def list_entities(self, kind: EntityKind) -> list[EntityInfo]:
        return [entity_from_entry(e) for e in self._feed(f"$Resources/{kind.value}s")]

    def put_entity(self, kind: EntityKind, name: str, properties: dict[str, Any], update: bool = False) -> EntityInfo:
        body = description_request(kind, properties)
        return entity_from_entry(self._entry("PUT", entity_path(name), body, update))

    def delete_entity(self, name: str) -> None:
        self._request("DELETE", entity_path(name))

    def get_subscription(self, topic: str, name: str) -> EntityInfo:
        return entity_from_entry(self._entry("GET", subscription_path(topic, name)))

    def list_subscriptions(self, topic: str) -> list[EntityInfo]:
        return [entity_from_entry(e) for e in self._feed(subscription_path(topic))]

    def put_subscription(
        self,
        topic: str,
        name: str,
        properties: dict[str, Any],
        update: bool = False,
        default_rule: Rule | None = None,
    ) -> EntityInfo:
        body = description_request(EntityKind.SUBSCRIPTION, properties, default_rule)
        return entity_from_entry(self._entry("PUT", subscription_path(topic, name), body, update))

    def delete_subscription(self, topic: str, name: str) -> None:
        self._request("DELETE", subscription_path(topic, name))

    # --------------------------------------------------------------------------------------------- rules
    def get_rule(self, topic: str, subscription: str, name: str) -> Rule:
        return rule_from_entry(self._entry("GET", rule_path(topic, subscription, name)))

    def list_rules(self, topic: str, subscription: str) -> list[Rule]:
        return [rule_from_entry(e) for e in self._feed(rule_path(topic, subscription))]

    def put_rule(self, topic: str, subscription: str, rule: Rule, update: bool = False) -> Rule:
        return rule_from_entry(
            self._entry("PUT", rule_path(topic, subscription, rule.name), rule_request(rule), update)
        )

    def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        self._request("DELETE", rule_path(topic, subscription, name))

    # --------------------------------------------------------------------------------------------- HTTP
    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _entry(self, method: str, path: str, body: bytes | None = None, update: bool = False) -> ET.Element:
        data = self._request(method, path, body, update)
        root = _parse(data, path)
        if _local(root.tag) != "entry":
            # The service answers a GET of a missing entity with an empty feed rather than 404.
            raise AdminError(404, f"'{path}' was not found.", path)
        return root

    def _feed(self, path: str) -> list[ET.Element]:
        entries: list[ET.Element] = []
        skip = 0
        while True:
            root = _parse(self._request("GET", path, query=f"$skip={skip}&$top={PAGE}"), path)
            page = _children(root, "entry")
            entries.extend(page)
            if len(page) < PAGE:
                return entries
            skip += PAGE

    def _request(
        self, method: str, path: str, body: bytes | None = None, update: bool = False, query: str = ""
    ) -> bytes:
        token = sas.generate_token(self.audience, self.settings.key_name, self.settings.key, ttl_seconds=3600)
        headers = {
            "Authorization": token,
            "Host": f"{self.settings.host}:{self.settings.port}",
            "Accept": "application/xml",
        }
        if body is not None:
            headers["Content-Type"] = "application/atom+xml;type=entry;charset=utf-8"
        if update:
            headers["If-Match"] = "*"
        target = f"/{path}?{query + '&' if query else ''}api-version={API_VERSION}"
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()  # a kept-alive connection the server has closed: one fresh try
                if attempt == 2:
                    raise
        if response.status >= 400:
            raise AdminError(response.status, _error_detail(data) or response.reason, path)
        return data

    def _connection(self) -> http.client.HTTPSConnection:
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(
                self.settings.host, self.settings.port, context=self.context, timeout=self.timeout
            )
        return self._conn


def _parse(data: bytes, path: str) -> ET.Element:
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise AdminError(502, f"the broker's answer is not XML: {exc}", path) from None


def _error_detail(data: bytes) -> str:
    """``<Error><Code/><Detail/></Error>``'s detail, or the body's text."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return data.decode("utf-8", "replace").strip()
    detail = _children(root, "Detail")
    return (detail[0].text or "").strip() if detail else ""
