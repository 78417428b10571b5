"""The retriever service: ``uvicorn retriever_server.app:app``.

The index loads (or is built, the first time) in the background after start-up, so ``GET /health`` can answer
``loading`` meanwhile; ``POST /retrieve`` answers 503 until the index is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from retriever_server.batching import QueryBatcher
from retriever_server.build_index import index_path, load_retriever
from retriever_server.corpus import load_corpus
from retriever_server.metrics import ServiceMetrics
from retriever_server.routes import router
from retriever_server.service import SearchService
from retriever_server.settings import Method, Settings, get_settings
from retriever_server.state import AppState

logger = logging.getLogger("retriever_server")

ASGIApp = Any


class LimitsAndMetricsMiddleware:
    """Rejects bodies over ``max_bytes`` with 413, records request counts and latency per path, and reads any
    ``POST /retrieve`` body as JSON whatever its content type (``curl -d`` sends form-encoded by default)."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServiceMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"] if scope["path"] in ("/retrieve", "/health", "/metrics") else "other"
        status = 500
        rejected = False  # we answered 413 ourselves; drop whatever the app sends afterwards
        received = 0

        async def send_wrapper(message: dict) -> None:
            nonlocal status
            if rejected:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def receive_limited() -> dict:
            nonlocal received, rejected, status
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes and not rejected:
                    await self._reject_too_large(send)
                    rejected, status = True, 413
                    return {"type": "http.disconnect"}  # the app stops reading and gives up on the request
            return message

        headers = dict(scope["headers"])
        if path == "/retrieve" and b"json" not in headers.get(b"content-type", b""):
            headers[b"content-type"] = b"application/json"
            scope = dict(scope, headers=list(headers.items()))
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = 0
        try:
            if length > self.max_bytes:
                await self._reject_too_large(send)
                status = 413
            else:
                await self.app(scope, receive_limited, send_wrapper)
        finally:
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - t0)

    async def _reject_too_large(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"request body is over the {self.max_bytes}-byte limit (RETRIEVER_MAX_BODY_BYTES)"}
        )
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})


def _load_blocking(state: AppState) -> tuple[Any, Any]:
    s = state.settings
    corpus = load_corpus(s.corpus_path)
    retriever = load_retriever(corpus, s)
    method = Method.dense if s.method is Method.hybrid else s.method
    state.index_path = str(index_path(corpus, method, s))
    return corpus, retriever


async def _load(state: AppState) -> None:
    s = state.settings
    try:
        corpus, retriever = await asyncio.to_thread(_load_blocking, state)
    except Exception as e:  # process boundary: report through /health instead of dying silently
        logger.exception("loading the %s index failed", s.method.value)
        state.error = f"{type(e).__name__}: {e}"
        return
    batcher = QueryBatcher(
        retriever, s.batch_max_queries, s.batch_max_wait_ms / 1000, state.metrics, s.batch_wait_fraction
    )
    batcher.start()
    state.service = SearchService(corpus, batcher, s.method.value, s.cache_size, state.metrics)
    state.metrics.documents.set(len(corpus))
    state.metrics.ready.set(1)
    logger.info("retriever ready: %s over %d documents", s.method.value, len(corpus))


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the index loads in the background once the server starts."""
    state = AppState(settings=settings or get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        loader = asyncio.create_task(_load(state))
        yield
        loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
        if state.service is not None:
            await state.service.batcher.close()

    app = FastAPI(title="search-rl retriever", version="0.1.0", lifespan=lifespan)
    app.state.retriever = state
    app.include_router(router)
    app.add_middleware(LimitsAndMetricsMiddleware, max_bytes=state.settings.max_body_bytes, metrics=state.metrics)
    return app


app = create_app()
