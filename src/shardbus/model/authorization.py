"""Shared access authorization rules: a key name, two keys and the rights a token signed with either key grants.

As in the service, rules live on the namespace (Config.json, plus ``RootManageSharedAccessKey`` from ``--key``) and
on queues and topics (their descriptions' ``authorization_rules``, set through the admin client). ``Manage`` implies
``Send`` and ``Listen``, and a rule that has it must list them too (the service refuses it otherwise). A rule
without keys gets random 256-bit keys, base64-encoded, as the service generates them.

Pure values: which rule a token names, and whether its signature matches, is ``access/authority.py``'s work.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .errors import ArgumentError


class AccessRight(enum.StrEnum):
    MANAGE = "Manage"
    SEND = "Send"
    LISTEN = "Listen"

    @classmethod
    def parse(cls, value: Any) -> AccessRight:
        text = str(getattr(value, "value", value)).strip()
        for right in cls:
            if right.value.lower() == text.lower():
                return right
        raise ArgumentError(f"Unknown access right '{value}': use Manage, Send or Listen.")


ALL_RIGHTS = frozenset(AccessRight)
_KEY_NAME = re.compile(r"[A-Za-z0-9._\-]{1,256}")
MAX_KEY_LENGTH = 256
CLAIM_TYPE = "SharedAccessKey"


def generate_key() -> str:
    """A random 256-bit key, base64-encoded (44 characters), like the service's."""
    import base64
    import secrets  # here: start-up does not pay for them (random's import); rules without keys are rare

    return base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def effective_rights(rights: Iterable[AccessRight | str]) -> frozenset[AccessRight]:
    """What ``rights`` allow: Manage brings Send and Listen."""
    granted = frozenset(AccessRight.parse(r) for r in rights)
    return ALL_RIGHTS if AccessRight.MANAGE in granted else granted


@dataclass(frozen=True)
class AuthorizationRule:
    """One shared access policy. ``rights`` as given (Manage listed with Send and Listen); times in Unix seconds."""

    key_name: str
    primary_key: str = ""
    secondary_key: str = ""
    rights: tuple[str, ...] = ()
    created: float = 0.0
    modified: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rights", tuple(AccessRight.parse(r).value for r in self.rights))

    @property
    def granted(self) -> frozenset[AccessRight]:
        """What a token signed with this rule's keys may do."""
        return effective_rights(self.rights)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.primary_key, self.secondary_key) if k)

    def validate(self) -> AuthorizationRule:
        """Checked as the service checks a rule; returns it with generated keys where none were given."""
        if not isinstance(self.key_name, str) or not _KEY_NAME.fullmatch(self.key_name):
            raise ArgumentError(
                f"The authorization rule key name '{self.key_name}' is invalid: use 1-256 letters, digits, periods, "
                "hyphens and underscores."
            )
        if not self.rights:
            raise ArgumentError(f"The authorization rule '{self.key_name}' needs at least one right.")
        if len(set(self.rights)) != len(self.rights):
            raise ArgumentError(f"The authorization rule '{self.key_name}' lists a right twice.")
        if AccessRight.MANAGE.value in self.rights and len(self.rights) != 3:
            raise ArgumentError(
                f"The authorization rule '{self.key_name}': a rule with Manage rights must also have Send and Listen."
            )
        for label, key in (("PrimaryKey", self.primary_key), ("SecondaryKey", self.secondary_key)):
            if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH:
                raise ArgumentError(
                    f"The authorization rule '{self.key_name}': {label} must be text of at most {MAX_KEY_LENGTH} "
                    "characters."
                )
        return replace(
            self, primary_key=self.primary_key or generate_key(), secondary_key=self.secondary_key or generate_key()
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_name": self.key_name,
            "primary_key": self.primary_key,
            "secondary_key": self.secondary_key,
            "rights": list(self.rights),
            "created": self.created,
            "modified": self.modified,
        }

    @classmethod
    def from_dict(cls, data: Any) -> AuthorizationRule:
        if isinstance(data, AuthorizationRule):
            return data
        if isinstance(data, dict):
            known = ("key_name", "primary_key", "secondary_key", "rights", "created", "modified")
            return cls(**{k: data[k] for k in known if k in data})
        return from_sdk(data)


def from_sdk(rule: Any) -> AuthorizationRule:
    """An ``azure.servicebus.management.AuthorizationRule`` (or anything with its attributes) to ours."""
    claim_type = getattr(rule, "claim_type", None)
    if claim_type not in (None, CLAIM_TYPE):
        raise ArgumentError(f"Unsupported authorization rule claim type '{claim_type}': use '{CLAIM_TYPE}'.")
    return AuthorizationRule(
        key_name=getattr(rule, "key_name", None) or "",
        primary_key=getattr(rule, "primary_key", None) or "",
        secondary_key=getattr(rule, "secondary_key", None) or "",
        rights=tuple(getattr(rule, "rights", None) or ()),
    )


def prepare_rules(
    rules: Iterable[Any], previous: Iterable[AuthorizationRule] = (), now: float | None = None
) -> list[AuthorizationRule]:
    """Rules as an entity stores them: validated, keys generated, names unique (case-insensitively), creation times
    kept from ``previous`` rules of the same name and modification times moved only where something changed."""
    now = time.time() if now is None else now
    old = {r.key_name.lower(): r for r in previous}
    result: list[AuthorizationRule] = []
    seen: set[str] = set()
    for raw in rules:
        rule = AuthorizationRule.from_dict(raw)
        lower = str(rule.key_name).lower()
        if lower in seen:
            raise ArgumentError(f"The authorization rule key name '{rule.key_name}' is used twice.")
        seen.add(lower)
        before = old.get(lower)
        rule = rule.validate() if before is None else _keep_keys(rule, before).validate()
        if before is not None and (rule.keys, rule.rights) == (before.keys, before.rights):
            rule = replace(rule, created=before.created, modified=before.modified)
        else:
            rule = replace(rule, created=before.created if before else now, modified=now)
        result.append(rule)
    return result


def _keep_keys(rule: AuthorizationRule, before: AuthorizationRule) -> AuthorizationRule:
    """An update that leaves a key out keeps the one the rule had (the service does not regenerate it)."""
    return replace(
        rule,
        primary_key=rule.primary_key or before.primary_key,
        secondary_key=rule.secondary_key or before.secondary_key,
    )
