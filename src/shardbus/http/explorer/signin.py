"""Who may use the explorer: sign-in with the namespace's SAS key, the session cookie, and CSRF tokens.

The session cookie *is* a SAS token (``access.sas``) for the namespace, signed with the key the user signed in
with and valid ``SESSION_SECONDS``: every request checks it exactly as the admin API checks its Authorization
header, so nothing is kept in memory per session (any front end of ``serve --frontends M`` accepts it), a wrong or
rotated key ends it, and the key itself is never stored nor shown again. The cookie is HttpOnly, SameSite=Strict,
Path=/explorer, and Secure over HTTPS. Signing out clears the cookie in the browser; a copy of the token stays valid
until it expires, like any SAS token.

Every state-changing form carries a CSRF token derived from the session (HMAC of the session token with the
namespace key): a page of another site cannot read it, and a post without it (or with another session's) is 403.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ...access import sas
from ...access.authority import MANAGE, Authority
from ...access.directory import NamespaceDirectory
from ...client import ConnectionSettings
from ...model.errors import Unauthorized
from ...namespace import Namespace
from ..protocol import HttpRequest

COOKIE = "shardbus_explorer"
COOKIE_PATH = "/explorer"
SESSION_SECONDS = 3600
CSRF_FIELD = "csrf"


class Forbidden(Exception):
    """A state-changing request without a valid CSRF token (403)."""


@dataclass(frozen=True, slots=True)
class ExplorerSession:
    namespace: Namespace
    key_name: str
    expiry: int
    csrf: str


def _csrf(key: str, token: str) -> str:
    digest = hmac.new(key.encode("utf-8"), f"shardbus-explorer-csrf\n{token}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def sign_in(
    directory: NamespaceDirectory,
    request_host: str,
    connection_string: str = "",
    key_name: str = "",
    key: str = "",
    now: float | None = None,
) -> tuple[str, ExplorerSession]:
    """Check the credentials like the admin API does (a SAS token signed with them must validate against the
    namespace's keys) and return (cookie value, session). Raises ``Unauthorized`` with the service's reason."""
    host = request_host
    if connection_string.strip():
        try:
            settings = ConnectionSettings.parse(connection_string.strip())
        except ValueError as exc:
            raise Unauthorized(f"The connection string cannot be read: {exc}") from None
        host, key_name, key = settings.host, settings.key_name, settings.key
    if not key_name or not key:
        raise Unauthorized("Give a connection string, or a key name and its key.")
    namespace, authority = directory.resolve(host)
    resource = f"sb://{namespace.name.lower()}/"
    token = sas.generate_token(resource, key_name, key, SESSION_SECONDS, now)
    return quote(token, safe=""), _session(namespace, authority, token, now)


def _session(namespace: Namespace, authority: Authority, token: str, now: float | None) -> ExplorerSession:
    """The session a token for the namespace opens: the explorer manages entities, so its rule needs Manage, as
    the admin API does. The CSRF secret is the rule's keys, so rotating one ends the forms of open sessions too."""
    claims = authority.validate(token, now)
    rule = authority.rules.get(claims.key_name)
    if MANAGE not in claims.rights or rule is None:
        raise Unauthorized(
            f"The explorer needs a namespace rule with Manage rights; '{claims.key_name}' has "
            f"{', '.join(sorted(r.value for r in claims.rights)) or 'none'}."
        )
    return ExplorerSession(namespace, claims.key_name, claims.expiry, _csrf("\n".join(rule.keys), token))


def cookie_of(request: HttpRequest) -> str | None:
    for part in request.headers.get("cookie", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE:
            return value
    return None


def session_of(directory: NamespaceDirectory, request: HttpRequest, now: float | None = None) -> ExplorerSession:
    """The request's session; ``Unauthorized`` without a valid one (missing, expired, or signed with a key the
    namespace no longer has)."""
    value = cookie_of(request)
    if not value:
        raise Unauthorized("Sign in with the namespace's connection string or SAS key.")
    token = unquote(value)
    fields = dict(parse_qsl(token[len(sas.PREFIX) :], keep_blank_values=True))
    name = urlsplit(fields.get("sr", "")).hostname or ""
    if name not in directory.namespaces:
        raise Unauthorized("The session names no namespace of this broker: sign in again.")
    namespace, authority = directory.resolve(name)
    return _session(namespace, authority, token, now)


def check_csrf(session: ExplorerSession, submitted: str | None) -> None:
    if not submitted or not hmac.compare_digest(submitted.encode(), session.csrf.encode()):
        raise Forbidden("The form has no valid CSRF token: reload the page and try again.")


def session_cookie(value: str, secure: bool, now: float | None = None) -> str:
    """The Set-Cookie value for a new session."""
    max_age = SESSION_SECONDS - 5  # the browser drops it just before the token expires
    attrs = f"{COOKIE}={value}; Path={COOKIE_PATH}; Max-Age={max_age}; HttpOnly; SameSite=Strict"
    return attrs + ("; Secure" if secure else "")


def cleared_cookie(secure: bool) -> str:
    attrs = f"{COOKIE}=; Path={COOKIE_PATH}; Max-Age=0; HttpOnly; SameSite=Strict"
    return attrs + ("; Secure" if secure else "")


def remaining(session: ExplorerSession, now: float | None = None) -> int:
    return max(0, int(session.expiry - (time.time() if now is None else now)))
