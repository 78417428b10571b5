"""ASGI middleware in front of every route: who may call, what body is read, and request metrics.

- ``Host`` (and a browser's ``Origin``) must name this server: a loopback name, the bind host (``RETRIEVER_HOST``),
  the address the request arrived on, or a name in ``RETRIEVER_ALLOWED_HOSTS``. Otherwise a web page open in the
  user's browser could post to the local retriever, directly or by DNS rebinding (its own name resolving to
  127.0.0.1). Refused with 400 (Host) or 403 (Origin).
- ``POST /retrieve`` must declare its body as JSON (``Content-Type: application/json``), else 415. Browsers send
  text/plain and form bodies to other sites without asking; a JSON body needs a CORS preflight, which this server
  does not grant.
- A body over ``max_body_bytes`` gets 413; a body not fully arrived ``request_timeout_s`` after the request's headers
  gets 408. (Half-sent headers never reach an ASGI app; ``http_guard`` closes those.)
- Requests and latency are counted per path for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from retriever_server.api.metrics import ServiceMetrics
from retriever_server.settings import Settings

ASGIApp = Any
Scope = dict[str, Any]
Message = dict[str, Any]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})
_PATHS = ("/retrieve", "/health", "/metrics")


def host_of(value: str) -> str:
    """The host part of a ``Host`` header value, lower-case, without port or IPv6 brackets.

    >>> host_of("[::1]:8000"), host_of("Node-A:8000"), host_of("10.0.0.5")
    ('::1', 'node-a', '10.0.0.5')
    """
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.partition(":")[0] if value.count(":") == 1 else value


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def send_json(send: Any, status: int, detail: str, close: bool = False) -> None:
    """Send a complete ``{"detail": ...}`` answer; ``close`` ends the connection after it (the body was not read)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """The checks listed in the module docstring, then the app."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.max_bytes = settings.max_body_bytes
        self.timeout_s = settings.request_timeout_s
        self.any_host = "*" in settings.allowed_hosts
        self.allowed = (LOOPBACK_HOSTS | {host_of(settings.host)} | set(settings.allowed_hosts)) - _ANY_ADDRESS

    def host_allowed(self, name: str, scope: Scope) -> bool:
        """A loopback or configured name, or the address this request arrived on (an IP the client dialled)."""
        if self.any_host or name in self.allowed:
            return True
        server = scope.get("server")
        return server is not None and name == str(server[0]).lower()

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, detail) when the request is refused before the app sees it, else ``None``."""
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not self.host_allowed(host_of(host), scope):
            return 400, (
                f"Host {host!r} is not allowed: call the retriever by a loopback name or its IP, or start it with "
                f"RETRIEVER_ALLOWED_HOSTS={host_of(host)} (comma-separated names; * allows any)"
            )
        origin = headers.get(b"origin", b"").decode("latin-1")
        if origin and not self.host_allowed(urlsplit(origin).hostname or "", scope):
            return 403, f"requests from web pages of other sites are refused (Origin {origin!r})"
        if scope["method"] == "POST" and scope["path"] == "/retrieve":
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            if not _is_json(content_type):
                return 415, (
                    f"POST /retrieve takes a JSON body: send Content-Type: application/json (got "
                    f"{content_type or 'none'!r}); with curl use --json, or -H 'Content-Type: application/json'"
                )
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = 0
        if length > self.max_bytes:
            return 413, f"request body is over the {self.max_bytes}-byte limit (RETRIEVER_MAX_BODY_BYTES)"
        return None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"] if scope["path"] in _PATHS else "other"
        status = 500
        answered = False  # we answered (413/408) ourselves; drop whatever the app sends afterwards
        body_done = False
        received = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if answered:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def guarded_receive() -> Message:
            nonlocal answered, body_done, received, status
            if answered:
                return {"type": "http.disconnect"}
            if body_done:  # later reads only wait for the client to go away (see routes.py); no deadline
                return dict(await receive())
            try:
                message = await asyncio.wait_for(receive(), t0 + self.timeout_s - time.perf_counter())
            except TimeoutError:
                detail = f"request body not received within {self.timeout_s:g}s (RETRIEVER_REQUEST_TIMEOUT_S)"
                await send_json(send, 408, detail, close=True)
                answered, status = True, 408
                return {"type": "http.disconnect"}  # the app stops reading and gives up on the request
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    detail = f"request body is over the {self.max_bytes}-byte limit (RETRIEVER_MAX_BODY_BYTES)"
                    await send_json(send, 413, detail, close=True)
                    answered, status = True, 413
                    return {"type": "http.disconnect"}
                body_done = not message.get("more_body", False)
            return dict(message)

        try:
            problem = self.refusal(scope)
            if problem is not None:
                status = problem[0]
                await send_json(send, *problem, close=True)
            else:
                await self.app(scope, guarded_receive, send_wrapper)
        finally:
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - t0)
