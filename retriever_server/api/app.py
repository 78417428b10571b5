"""The retriever service: ``uvicorn retriever_server.app:app``.

The index loads (or is built, the first time) in the background after start-up, so ``GET /health`` can answer
``loading`` meanwhile; ``POST /retrieve`` answers 503 until the index is ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from retriever_server.api.batching import QueryBatcher
from retriever_server.api.errors import install_error_handlers
from retriever_server.api.middleware import GuardMiddleware
from retriever_server.api.openapi import install_openapi
from retriever_server.api.routes import router
from retriever_server.api.schemas import LoadProgress
from retriever_server.api.service import SearchService
from retriever_server.api.state import AppState
from retriever_server.index.build import index_path, load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.settings import Method, Settings, get_settings

logger = logging.getLogger("retriever_server")


def _load_blocking(state: AppState) -> tuple[Any, Any]:
    s = state.settings
    t0 = time.monotonic()

    def report(stage: str, done: int, total: int) -> None:  # shown by GET /health while loading
        state.progress = LoadProgress(stage=stage, done=done, total=total, elapsed_s=round(time.monotonic() - t0, 1))

    report("reading corpus", 0, 0)
    corpus = load_corpus(s.corpus_path, s.docstore_root(), progress=report)
    retriever = load_retriever(corpus, s, progress=report)
    method = Method.dense if s.method is Method.hybrid else s.method
    prebuilt = s.prebuilt_index is not None and method is Method.dense
    state.index_path = str(s.prebuilt_index if prebuilt else index_path(corpus, method, s))
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
        retriever,
        s.batch_max_queries,
        s.batch_max_wait_ms / 1000,
        state.metrics,
        s.batch_wait_fraction,
        max_chars=s.batch_max_chars,
        max_queue_wait_s=s.max_queue_wait_s,
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
    install_error_handlers(app)
    install_openapi(app, state.settings)
    app.add_middleware(GuardMiddleware, settings=state.settings, metrics=state.metrics)
    return app


app = create_app()
