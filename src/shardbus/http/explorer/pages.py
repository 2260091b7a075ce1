"""The explorer's routes: ``ROUTES`` maps (method, path) to a handler; each handler reads or changes the signed-in
namespace (``readings``, ``actions``) and answers a page rendered from ``templates/`` (Jinja2, autoescaped), a
fragment for the auto-refresh, or a redirect after a form.

Every route but the sign-in page and the static files needs a session (``signin``): a page without one answers
401 with the sign-in form, a data call or form post 401. Every POST but the sign-in itself needs the session's
CSRF token (403 without). Handlers run on the HTTP worker pool (they may wait for partitions' stores).

In memory: the compiled templates and the two static files (a few tens of KB, fixed), and the rate history
(``history``: bounded by samples per entity and entities); nothing per session or per request survives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape

from ...access.directory import NamespaceDirectory
from ...model import ages
from ...model.entities import EntityKind
from ...model.errors import ArgumentError, ShardbusError, Unauthorized, http_status_of
from ..protocol import HttpRequest, HttpResponse
from . import actions, charts, readings, signin
from .history import RateHistory

log = logging.getLogger("shardbus.http.explorer")

PREFIX = "/explorer"
HTML = "text/html; charset=utf-8"
REFRESH_SECONDS = 3
# Nothing loads from anywhere but this port; no inline script or style; no framing.
SECURITY_HEADERS = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
]
NONE = "\u2013"  # an en dash where there is no value
STATIC_TYPES = {"explorer.css": "text/css; charset=utf-8", "explorer.js": "text/javascript; charset=utf-8"}


@dataclass(slots=True)
class Call:
    request: HttpRequest
    query: dict[str, list[str]]
    form: dict[str, list[str]]
    session: signin.ExplorerSession | None

    def arg(self, name: str, default: str = "") -> str:
        return (self.query.get(name) or [default])[0]

    @property
    def ns(self) -> Any:
        assert self.session is not None
        return self.session.namespace

    @property
    def secure(self) -> bool:
        return self.request.scheme == "https"


class Redirect(Exception):
    def __init__(self, location: str) -> None:
        self.location = location


# --------------------------------------------------------------------------------------------- formatting
def human_age(seconds: float | None) -> str:
    return ages.human_age(seconds) or NONE


def human_bytes(n: int | None) -> str:
    if n is None:
        return NONE
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def human_time(value: Any) -> str:
    if value is None:
        return NONE
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def rate(value: float | None) -> str:
    return NONE if value is None else (f"{value:.1f}" if value < 100 else f"{value:.0f}")


def url(where: str, /, **params: Any) -> str:
    # ``from_`` stands for ``from`` (a Python keyword)
    query = urlencode({k.rstrip("_"): v for k, v in params.items() if v is not None and v != ""})
    return f"{PREFIX}{where}" + (f"?{query}" if query else "")


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("shardbus.http.explorer", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=human_age, bytes=human_bytes, time=human_time, rate=rate)
    env.globals.update(
        url=url,
        heat_strip=charts.heat_strip,
        sparkline=charts.sparkline,
        SUB_QUEUES=readings.SUB_QUEUES,
        refresh_seconds=REFRESH_SECONDS,
        split_sequence=readings.split_sequence,
    )
    return env


def _static_files() -> dict[str, bytes]:
    folder = resources.files("shardbus.http.explorer") / "static"
    return {name: (folder / name).read_bytes() for name in STATIC_TYPES}


# ------------------------------------------------------------------------------------------------- pages
class Explorer:
    """The explorer over a ``NamespaceDirectory``; ``handle`` is synchronous (run it on a worker thread)."""

    def __init__(self, directory: NamespaceDirectory) -> None:
        self.directory = directory
        self.history = RateHistory()
        self.env = _environment()
        self.static = _static_files()
        self.routes: dict[tuple[str, str], Callable[[Call], HttpResponse]] = {
            ("GET", ""): self.overview,
            ("GET", "/"): self.overview,
            ("GET", "/signin"): self.signin_page,
            ("POST", "/signin"): self.signin,
            ("POST", "/signout"): self.signout,
            ("GET", "/entity"): self.entity,
            ("GET", "/partitions"): self.partitions_fragment,
            ("GET", "/messages"): self.messages,
            ("GET", "/message"): self.message,
            ("POST", "/send"): self.send,
            ("POST", "/resubmit"): self.resubmit,
            ("POST", "/purge"): self.purge,
            ("POST", "/cancel"): self.cancel,
            ("POST", "/create"): self.create,
            ("POST", "/delete"): self.delete,
        }
        self.open_routes = {("GET", "/signin"), ("POST", "/signin")}  # answered without a session

    # --- dispatch --------------------------------------------------------------------------------------
    def handle(self, request: HttpRequest) -> HttpResponse:
        split = urlsplit(request.target)
        sub = split.path[len(PREFIX) :]
        if sub.startswith("/static/") and request.method in ("GET", "HEAD"):
            return self._static(sub[len("/static/") :])
        method = "GET" if request.method == "HEAD" else request.method
        route = self.routes.get((method, sub))
        if route is None:
            known = any(p == sub for _m, p in self.routes)
            return self._plain(405 if known else 404, "Method not allowed." if known else "Not found.")
        query = parse_qs(split.query, keep_blank_values=True)
        form: dict[str, list[str]] = {}
        if method == "POST":
            form = parse_qs(request.body.decode("utf-8", "replace"), keep_blank_values=True)
        call = Call(request, query, form, None)
        try:
            if (method, sub) not in self.open_routes:
                try:
                    call.session = signin.session_of(self.directory, request)
                except Unauthorized as exc:
                    return self._unauthorized(call, str(exc), page=method == "GET" and sub != "/partitions")
                if method == "POST":
                    signin.check_csrf(call.session, (form.get(signin.CSRF_FIELD) or [None])[0])
            return route(call)
        except Redirect as r:
            return HttpResponse(303, b"", None, [("location", r.location), *SECURITY_HEADERS])
        except signin.Forbidden as exc:
            return self._error(call, 403, str(exc))
        except ShardbusError as exc:
            return self._error(call, http_status_of(exc), str(exc) or type(exc).__name__)
        except Exception as exc:  # a bug must not take the connection down
            log.exception("explorer request %s %s failed", request.method, request.target)
            return self._error(call, 500, f"Internal error: {type(exc).__name__}: {exc}")

    # --- responses -------------------------------------------------------------------------------------
    def render(
        self, template: str, call: Call, status: int = 200, headers: list[tuple[str, str]] | None = None, **values: Any
    ) -> HttpResponse:
        session = call.session
        body = self.env.get_template(template).render(
            session=session,
            csrf=session.csrf if session is not None else "",
            namespace=session.namespace.name if session is not None else None,
            note=call.arg("note"),
            here=call.request.target,
            **values,
        )
        return HttpResponse(status, body.encode("utf-8"), HTML, [*SECURITY_HEADERS, *(headers or [])])

    def _plain(self, status: int, text: str) -> HttpResponse:
        return HttpResponse(status, text.encode("utf-8"), "text/plain; charset=utf-8", list(SECURITY_HEADERS))

    def _unauthorized(self, call: Call, reason: str, page: bool) -> HttpResponse:
        if not page:
            return self._plain(401, f"Unauthorized: {reason}")
        if signin.cookie_of(call.request):  # say why a session ended; a first visit needs no reason
            reason = f"Your session ended ({reason}): sign in again."
        else:
            reason = None
        return self.render("signin.html", call, 401, error=None, reason=reason, back=call.request.target)

    def _error(self, call: Call, status: int, detail: str) -> HttpResponse:
        return self.render(
            "error.html",
            call,
            status,
            error_status=status,
            detail=detail,
            back=_safe_back((call.form.get("back") or [""])[0]) or PREFIX,
        )

    def _static(self, name: str) -> HttpResponse:
        data = self.static.get(name)
        if data is None:
            return self._plain(404, "Not found.")
        return HttpResponse(
            200, data, STATIC_TYPES[name], [("cache-control", "max-age=300"), ("x-content-type-options", "nosniff")]
        )

    # --- sign-in ---------------------------------------------------------------------------------------
    def signin_page(self, call: Call) -> HttpResponse:
        return self.render("signin.html", call, error=None, reason=None, back=_safe_back(call.arg("back")))

    def signin(self, call: Call) -> HttpResponse:
        f = call.form
        try:
            cookie, _session = signin.sign_in(
                self.directory,
                call.request.host,
                (f.get("connection_string") or [""])[0],
                (f.get("key_name") or [""])[0].strip(),
                (f.get("key") or [""])[0].strip(),
            )
        except Unauthorized as exc:
            # the key is never echoed back: the form comes back empty but for the key name
            return self.render(
                "signin.html",
                call,
                401,
                error=str(exc),
                reason=None,
                key_name=(f.get("key_name") or [""])[0],
                back=_safe_back((f.get("back") or [""])[0]),
            )
        back = _safe_back((f.get("back") or [""])[0]) or PREFIX
        headers = [("set-cookie", signin.session_cookie(cookie, call.secure)), ("location", back)]
        return HttpResponse(303, b"", None, [*SECURITY_HEADERS, *headers])

    def signout(self, call: Call) -> HttpResponse:
        headers = [("set-cookie", signin.cleared_cookie(call.secure)), ("location", url("/signin"))]
        return HttpResponse(303, b"", None, [*SECURITY_HEADERS, *headers])

    # --- reading pages ---------------------------------------------------------------------------------
    def overview(self, call: Call) -> HttpResponse:
        return self.render("overview.html", call, view=readings.overview(call.ns))

    def _located(self, call: Call, path: str | None = None) -> readings.Located:
        path = path if path is not None else call.arg("path")
        if not path:
            raise ArgumentError("Name an entity: ?path=queue, topic or topic/Subscriptions/name.")
        return readings.locate(call.ns, path)

    def _partitions(self, call: Call, located: readings.Located) -> dict[str, Any]:
        rows = readings.partition_rows(call.ns, located, self.history)
        labels = []
        for r in rows:
            if r.healthy:
                labels.append(f"partition {r.id}: {r.active} active, {r.dead_letter} dead-lettered")
            else:
                labels.append(f"partition {r.id}: DOWN ({r.failure or 'unavailable'})")
        depths = [r.active if r.healthy else None for r in rows]
        top = max((v for r in rows for v in (*r.rates.incoming, *r.rates.outgoing)), default=0.0)
        return {
            "rows": rows,
            "strip": charts.heat_strip(depths, labels),
            "taken": time.time(),
            "down": [r.id for r in rows if not r.healthy],
            "top": top,
        }

    def entity(self, call: Call) -> HttpResponse:
        located = self._located(call)
        ns = call.ns
        runtime = ns.get_runtime_properties(located.path)
        sessions, more_sessions = readings.sessions(ns, located)
        return self.render(
            "entity.html",
            call,
            entity=located,
            kind=located.kind.value.lower() if hasattr(located.kind, "value") else str(located.kind),
            runtime=runtime,
            availability="Limited"
            if any(not p.get("healthy", True) for p in runtime.partitions)
            else ns.availability(located.path),
            parts=self._partitions(call, located),
            subscriptions=readings.subscriptions(ns, located),
            sessions=sessions,
            more_sessions=more_sessions,
            is_topic=located.kind is EntityKind.TOPIC,
        )

    def partitions_fragment(self, call: Call) -> HttpResponse:
        located = self._located(call)
        return self.render("_partitions.html", call, entity=located, parts=self._partitions(call, located))

    def messages(self, call: Call) -> HttpResponse:
        located = self._located(call)
        if not located.receivable:
            raise ArgumentError(f"'{located.path}' is a topic: its messages are in its subscriptions.")
        queue = call.arg("queue", "active")
        try:
            start = int(call.arg("from", "0") or 0)
        except ValueError:
            raise ArgumentError("from must be a sequence number.") from None
        page = readings.peek_page(call.ns, located.path, queue, start)
        return self.render(
            "messages.html",
            call,
            entity=located,
            queue=queue,
            page=page,
            start=start,
            queue_title=readings.SUB_QUEUES[queue][2],
        )

    def message(self, call: Call) -> HttpResponse:
        located = self._located(call)
        queue = call.arg("queue", "active")
        try:
            seq = int(call.arg("seq"))
        except ValueError:
            raise ArgumentError("seq must be a sequence number.") from None
        m = readings.find_message(call.ns, located.path, queue, seq)
        return self.render(
            "message.html",
            call,
            entity=located,
            queue=queue,
            m=m,
            system=readings.system_properties(m),
            body=readings.body_views(m),
            app_properties=[(k, v, type(v).__name__) for k, v in sorted((m.application_properties or {}).items())],
        )

    # --- actions ---------------------------------------------------------------------------------------
    def _done(self, call: Call, note: str, fallback: str = PREFIX) -> HttpResponse:
        back = _safe_back((call.form.get("back") or [""])[0]) or fallback
        back = _without_note(back)
        raise Redirect(back + ("&" if "?" in back else "?") + "note=" + quote(note))

    @staticmethod
    def _confirmed(call: Call, what: str) -> None:
        if "yes" not in call.form.get("confirmed", []):
            raise ArgumentError(f"{what} needs a confirmation (tick the box or confirm the dialog).")

    def _form_entity(self, call: Call) -> readings.Located:
        return self._located(call, (call.form.get("path") or [""])[0])

    def send(self, call: Call) -> HttpResponse:
        located = self._form_entity(call)
        return self._done(call, actions.send(call.ns, located, call.form), url("/entity", path=located.path))

    def resubmit(self, call: Call) -> HttpResponse:
        located = self._form_entity(call)
        if not located.receivable:
            raise ArgumentError("Dead letters belong to queues and subscriptions.")
        everything = (call.form.get("all") or [""])[0] == "yes"
        selected = None if everything else actions.sequence_numbers(call.form)
        if selected is not None and not selected:
            raise ArgumentError("Select the dead letters to resubmit, or resubmit all.")
        self._confirmed(call, "Resubmitting dead letters")
        done, left = actions.resubmit(call.ns, located, selected)
        note = f"Resubmitted {done} message(s) to {located.send_to}."
        if left:
            note += f" {left} {'selected were not found' if selected is not None else 'dead letters remain'}."
        return self._done(call, note, url("/messages", path=located.path, queue="deadletter"))

    def purge(self, call: Call) -> HttpResponse:
        located = self._form_entity(call)
        queue = (call.form.get("queue") or ["active"])[0]
        self._confirmed(call, "Purging")
        purged, down = actions.purge(call.ns, located, queue)
        note = f"Purged {purged} message(s) from {readings.address(located.path, queue)}."
        if down:
            note += f" Partitions {', '.join(map(str, down))} are down: their messages were not purged."
        return self._done(call, note, url("/entity", path=located.path))

    def cancel(self, call: Call) -> HttpResponse:
        located = self._form_entity(call)
        seqs = actions.sequence_numbers(call.form)
        if not seqs:
            raise ArgumentError("Select the scheduled messages to cancel.")
        return self._done(
            call,
            actions.cancel_scheduled(call.ns, located, seqs),
            url("/messages", path=located.path, queue="scheduled"),
        )

    def create(self, call: Call) -> HttpResponse:
        return self._done(call, actions.create(call.ns, call.form))

    def delete(self, call: Call) -> HttpResponse:
        self._confirmed(call, "Deleting")
        return self._done(call, actions.delete(call.ns, call.form))


def _safe_back(target: str) -> str:
    """A place in the explorer to go back to (never another site)."""
    if target.startswith(PREFIX) and not target.startswith("//") and "\\" not in target:
        split = urlsplit(target)
        if not split.scheme and not split.netloc:
            return target
    return ""


def _without_note(target: str) -> str:
    split = urlsplit(target)
    query = [
        (k, v) for k, values in parse_qs(split.query, keep_blank_values=True).items() for v in values if k != "note"
    ]
    return split.path + (f"?{urlencode(query)}" if query else "")
