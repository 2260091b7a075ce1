"""Shared Access Signature tokens, as Service Bus issues and checks them.

A token is ``SharedAccessSignature sr=<url-encoded resource>&sig=<url-encoded base64 HMAC>&se=<expiry>&skn=<key
name>``. The signature is HMAC-SHA256, keyed with the key text itself (UTF-8, not base64-decoded), over
``quote_plus(resource) + "\\n" + expiry``. A token grants access to its resource and everything below it.
Pure functions and values: keeps nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote_plus, urlsplit

from ..model.authorization import ALL_RIGHTS, AccessRight
from ..model.errors import Unauthorized

PREFIX = "SharedAccessSignature "


@dataclass(frozen=True, slots=True)
class SasClaims:
    resource: str
    key_name: str
    expiry: int
    rights: frozenset[AccessRight] = field(default=ALL_RIGHTS)  # those of the rule whose key signed the token


def _signature(key: str, encoded_resource: str, expiry: int) -> str:
    digest = hmac.new(key.encode("utf-8"), f"{encoded_resource}\n{expiry}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def generate_token(resource: str, key_name: str, key: str, ttl_seconds: int = 3600, now: float | None = None) -> str:
    """A token for ``resource`` (e.g. ``sb://localhost:5672/q1``), valid ``ttl_seconds``."""
    expiry = int((time.time() if now is None else now) + ttl_seconds)
    encoded = quote_plus(resource)
    sig = quote_plus(_signature(key, encoded, expiry))
    return f"{PREFIX}sr={encoded}&sig={sig}&se={expiry}&skn={quote_plus(key_name)}"


def resource_path(resource: str) -> str:
    """The path part of a resource or entity address, lower-cased, without scheme, host or slashes around it.
    Tokens say ``sb://host/q1`` while links say ``amqps://host:port/q1``: only paths are compared."""
    if "://" in resource:
        resource = urlsplit(resource).path
    return resource.strip("/").lower()


@dataclass(frozen=True, slots=True)
class ParsedToken:
    """A token's fields, not yet checked against any key."""

    resource: str
    key_name: str
    expiry: int
    signature: str

    def signed_with(self, key: str) -> bool:
        expected = _signature(key, quote_plus(self.resource), self.expiry)
        return hmac.compare_digest(expected.encode(), self.signature.encode())

    def check_expiry(self, now: float | None = None) -> None:
        if self.expiry <= (time.time() if now is None else now):
            raise Unauthorized(f"ExpiredToken: the token expired at {self.expiry} (Unix seconds).")


def parse_token(token: object) -> ParsedToken:
    """The fields of a ``SharedAccessSignature`` token. Raises ``Unauthorized`` for anything else."""
    if not isinstance(token, str) or not token.startswith(PREFIX):
        raise Unauthorized("InvalidSignature: the token is not a SharedAccessSignature token.")
    fields = dict(parse_qsl(token[len(PREFIX) :], keep_blank_values=True))
    missing = {"sr", "sig", "se", "skn"} - set(fields)
    if missing:
        raise Unauthorized(f"InvalidSignature: the token lacks {', '.join(sorted(missing))}.")
    try:
        expiry = int(fields["se"])
    except ValueError:
        raise Unauthorized("InvalidSignature: the token's expiry is not a number.") from None
    return ParsedToken(fields["sr"], fields["skn"], expiry, fields["sig"])


def validate_token(token: str, keys: dict[str, str], now: float | None = None) -> SasClaims:
    """Check a token's signature against ``keys`` (key name → key, each with every right) and its expiry.
    Raises ``Unauthorized``. Rules with rights are checked by ``authorization.Authority``."""
    parsed = parse_token(token)
    key = keys.get(parsed.key_name)
    if key is None:
        raise Unauthorized(f"InvalidSignature: the key name '{parsed.key_name}' is not known to this namespace.")
    if not parsed.signed_with(key):
        raise Unauthorized("InvalidSignature: the token has an invalid signature.")
    parsed.check_expiry(now)
    return SasClaims(parsed.resource, parsed.key_name, parsed.expiry)


def covers(claims: SasClaims, entity_address: str) -> bool:
    """Does a token for ``claims.resource`` grant access to ``entity_address`` (same path or below it)?"""
    granted = resource_path(claims.resource)
    wanted = resource_path(entity_address)
    return granted == "" or wanted == granted or wanted.startswith(granted + "/")
