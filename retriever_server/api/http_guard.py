"""uvicorn's httptools protocol with a deadline on receiving each request (``python -m retriever_server`` uses it).

uvicorn closes idle keep-alive connections, but never one whose request is only partly sent: a client that sends a
header line every few seconds (slowloris) holds a connection, and a file descriptor, for ever. With this protocol a
request's headers must arrive within ``RETRIEVER_REQUEST_TIMEOUT_S`` of its first byte (or of the connection
opening), else the server answers 408 and closes the connection. Once the headers are in, the app's middleware
bounds the body the same way (and answers 408 itself); this protocol closes the connection one second after that
deadline as a backstop, e.g. for a body still trickling in after the app answered.

With plain uvicorn:
``uvicorn retriever_server.app:app --http retriever_server.api.http_guard:DeadlineHttpToolsProtocol``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from retriever_server.settings import get_settings

_BODY_GRACE_S = 1.0
_TIMEOUT_BODY = b"request headers not received within RETRIEVER_REQUEST_TIMEOUT_S\n"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """Closes a connection whose request does not arrive within ``request_timeout_s`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = get_settings().request_timeout_s
        self._timer: asyncio.TimerHandle | None = None
        self._headers_done = True

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if not self._headers_done:  # the app never saw this request, so nothing else answers it
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_done = False  # a connection that sends nothing is closed too
        self._arm(self.read_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_done = False
        if self._timer is None:  # keep the earlier deadline of a connection that opened and idled
            self._arm(self.read_timeout_s)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._arm(self.read_timeout_s + _BODY_GRACE_S)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
