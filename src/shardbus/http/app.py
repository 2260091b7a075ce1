"""What the HTTP side of the listener serves: ``GET /health``, ``GET /metrics``, the explorer under ``/explorer``
(``http.explorer``), and the ATOM management API for everything else.

``/health`` answers on the event loop (it only reads in-memory state); management operations run on a small
worker pool, since they may wait for every partition's store and must not stall AMQP connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..access.directory import NamespaceDirectory
from ..metrics import CONTENT_TYPE, registry_for, render
from .admin import AdminApi
from .protocol import HttpRequest, HttpResponse

JSON_TYPE = "application/json"


class HttpFrontend:
    def __init__(self, directory: NamespaceDirectory, workers: int = 2) -> None:
        self.directory = directory
        self.admin = AdminApi(directory)
        self._explorer: Any = None  # built on its first request: a broker nobody browses never loads Jinja2
        self._explorer_lock = threading.Lock()
        self.ready = False  # set by the listener once it accepts connections
        self._registry = registry_for(lambda: self.directory.namespaces)
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="shardbus-http")
        self._local: dict[tuple[str, str], Callable[[HttpRequest], HttpResponse]] = {
            ("GET", "/health"): self.health,
            ("HEAD", "/health"): self.health,
        }

    async def handle(self, request: HttpRequest) -> HttpResponse:
        path = request.target.split("?", 1)[0]
        local = self._local.get((request.method, path))
        if local is not None:
            return local(request)
        # the rest may wait for partitions' locks or stores: off the event loop
        if (request.method, path) == ("GET", "/metrics"):
            handler = self.metrics
        elif (path == "/explorer" or path.startswith("/explorer/")) and "api-version=" not in request.target:
            handler = self.explorer  # the SDK always sends api-version: its queue named "explorer" stays reachable
        else:
            handler = self.admin.handle
        return await asyncio.get_running_loop().run_in_executor(self._executor, handler, request)

    def explorer(self, request: HttpRequest) -> HttpResponse:
        """The Service Bus Explorer pages (``http.explorer``)."""
        with self._explorer_lock:
            if self._explorer is None:
                from .explorer import Explorer

                self._explorer = Explorer(self.directory)
        return self._explorer.handle(request)

    def metrics(self, request: HttpRequest) -> HttpResponse:
        """Prometheus text format: per entity and partition counts and counters, connections, errors, latencies."""
        return HttpResponse(200, render(self._registry), CONTENT_TYPE, [("cache-control", "no-store")])

    def health(self, request: HttpRequest) -> HttpResponse:
        """Alive: the process answers. Ready: the listener accepts connections. Per namespace: entities whose
        partitions are not all available (their availability is Limited). ``pid``: the process that answered
        (with ``serve --frontends M``, one of the front ends sharing the port)."""
        namespaces: dict[str, Any] = {}
        for name, ns in self.directory.namespaces.items():
            entities = [d.name for d in ns.list_queues()] + [d.name for d in ns.list_topics()]
            limited = sorted(e for e in entities if ns.availability(e) == "Limited")
            namespaces[name] = {"tier": ns.tier.tier.value, "entities": len(entities), "limited": limited}
        body = {"alive": True, "ready": self.ready, "pid": os.getpid(), "namespaces": namespaces}
        status = 200 if self.ready else 503
        return HttpResponse(status, json.dumps(body).encode(), JSON_TYPE, [("cache-control", "no-store")])

    def close(self) -> None:
        self.ready = False
        self._executor.shutdown(wait=True, cancel_futures=True)
