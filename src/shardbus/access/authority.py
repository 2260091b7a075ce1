"""Who may do what in a namespace: shared access rules turn tokens (and SASL PLAIN credentials) into rights.

A token names its rule by key name (``skn``) and its resource (``sr``). The rule is looked for among the
namespace's rules (``RootManageSharedAccessKey`` from ``--key``, and Config.json's ``AuthorizationRules``) and
among the rules of the queue or topic the resource names or lies below; a token signed with either key of a rule
of that name carries that rule's rights. An entity's rule therefore authorizes only that entity and what lies
below it (its subscriptions, its sub-queues), since its token's resource must name it. Keys are read at each
validation, so a key rotated through the admin client refuses the next token signed with the old one; rights a
connection already holds last until its token expires, as with the service.

What each operation needs (the service's table, "Rights required for Service Bus operations", and what it does
where the table is silent): sending and scheduling need Send; receiving, peeking, settling, lock renewal, session
state and the rule operations of a subscription's ``$management`` node need Listen; the HTTPS management API
needs Manage for everything (the service answers reads with 401 too: "Manage,EntityRead claims required").

Nothing is kept here but the namespace rules; entity rules are read from the namespace's registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..model.authorization import AccessRight, AuthorizationRule
from ..model.errors import Unauthorized
from . import sas

if TYPE_CHECKING:
    from ..namespace import Namespace

MANAGE, SEND, LISTEN = AccessRight.MANAGE, AccessRight.SEND, AccessRight.LISTEN
_MANAGEMENT_PREFIXES = ("com.microsoft:", "com.shardbus:")
# $management operations (without their prefix) and the right each needs; an operation not listed needs Listen.
MANAGEMENT_RIGHTS: dict[str, AccessRight] = {
    "schedule-message": SEND,
    "cancel-scheduled-message": SEND,
    "peek-message": LISTEN,
    "renew-lock": LISTEN,
    "receive-by-sequence-number": LISTEN,
    "update-disposition": LISTEN,
    "renew-session-lock": LISTEN,
    "get-session-state": LISTEN,
    "set-session-state": LISTEN,
    "get-message-sessions": LISTEN,
    "add-rule": LISTEN,  # the service lets a subscription's listeners manage its rules over AMQP
    "remove-rule": LISTEN,
    "enumerate-rules": LISTEN,
    "range-offsets": LISTEN,
    "browse-range": LISTEN,
    "complete-below": LISTEN,
}


def management_right(operation: str) -> AccessRight:
    name = operation
    for prefix in _MANAGEMENT_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return MANAGEMENT_RIGHTS.get(name, LISTEN)


def missing_right(right: AccessRight, resource: str) -> Unauthorized:
    """The service's refusal of an operation the caller's rights do not cover."""
    return Unauthorized(
        f"Unauthorized access. '{right.value}' claim(s) are required to perform this operation. Resource: '{resource}'."
    )


class Authority:
    """One namespace's rules, for validating tokens and PLAIN credentials."""

    def __init__(self, namespace: Namespace | None, rules: Iterable[AuthorizationRule]) -> None:
        self.namespace = namespace
        self.rules = {r.key_name: r for r in rules}

    @classmethod
    def of_keys(cls, namespace: Namespace | None, keys: dict[str, str]) -> Authority:
        """Rules from plain ``key name → key`` pairs, each with every right (the root key, tests)."""
        return cls(namespace, [AuthorizationRule(n, k, "", ("Manage", "Send", "Listen")) for n, k in keys.items()])

    def _candidates(self, key_name: str, path: str) -> list[AuthorizationRule]:
        found = []
        rule = self.rules.get(key_name)
        if rule is not None:
            found.append(rule)
        scope = self.namespace.authorization_scope(path) if self.namespace is not None and path else None
        if scope is not None:
            found += [r for r in scope[1] if r.key_name == key_name]
        return found

    def validate(self, token: Any, now: float | None = None) -> sas.SasClaims:
        """The claims of a valid, unexpired token signed by a rule of this namespace or of the entity its resource
        names. Raises ``Unauthorized``."""
        parsed = sas.parse_token(token)
        candidates = self._candidates(parsed.key_name, sas.resource_path(parsed.resource))
        if not candidates:
            raise Unauthorized(
                f"InvalidSignature: the key name '{parsed.key_name}' is not known to this namespace or to the "
                "entity the token is for."
            )
        for rule in candidates:
            if any(parsed.signed_with(key) for key in rule.keys):
                parsed.check_expiry(now)
                return sas.SasClaims(parsed.resource, parsed.key_name, parsed.expiry, rule.granted)
        raise Unauthorized("InvalidSignature: the token has an invalid signature.")

    def plain_known(self, key_name: str | None, key: str | None) -> bool:
        """Do SASL PLAIN credentials (key name and key) match any rule, of the namespace or of an entity?"""
        if not key_name or not key:
            return False
        rule = self.rules.get(key_name)
        if rule is not None and key in rule.keys:
            return True
        if self.namespace is None:
            return False
        return any(r.key_name == key_name and key in r.keys for _, r in self.namespace.entity_authorization_rules())

    def plain_rights(self, key_name: str, key: str, path: str) -> frozenset[AccessRight]:
        """The rights PLAIN credentials give on ``path``: the namespace rule's, or those of a rule of the entity
        ``path`` names or lies below."""
        for rule in self._candidates(key_name, path):
            if key in rule.keys:
                return rule.granted
        return frozenset()
