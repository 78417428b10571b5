"""The retriever service: ``uvicorn retriever_server.app:app``.

The index loads (or is built, the first time) in the background after start-up, so ``GET /health`` can answer
``loading`` meanwhile; ``POST /retrieve`` answers 503 until the index is ready.

The OpenAPI document (``GET /openapi.json``) has the configured request limits written in: they are settings,
checked by the route rather than declared on the model, so FastAPI's generated schema would accept 2,000 queries or
``topk: 500`` that the server then refuses. Filling them in keeps the document and the server in agreement (a
schemathesis run in the tests checks it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from retriever_server.api.batching import QueryBatcher
from retriever_server.api.errors import install_error_handlers
from retriever_server.api.middleware import GuardMiddleware
from retriever_server.api.routes import router
from retriever_server.api.schemas import LoadProgress
from retriever_server.api.service import CorpusDocuments, SearchService
from retriever_server.api.state import AppState, IndexLoader, LoadedIndex, ProgressFn
from retriever_server.identity import index_identity
from retriever_server.index.build import load_retriever
from retriever_server.index.corpus import load_corpus
from retriever_server.settings import Settings, get_settings

logger = logging.getLogger("retriever_server")


def load_local_index(settings: Settings, progress: ProgressFn) -> LoadedIndex:
    """The corpus and index of ``settings`` in this process, built the first time (the default loader)."""
    progress("reading corpus", 0, 0)
    corpus = load_corpus(settings.corpus_path, settings.docstore_root(), progress=progress)
    retriever = load_retriever(corpus, settings, progress=progress)
    return LoadedIndex(CorpusDocuments(corpus), retriever, index_identity(corpus, settings, progress))


async def _load(state: AppState, loader: IndexLoader) -> None:
    s = state.settings
    t0 = time.monotonic()

    def report(stage: str, done: int, total: int) -> None:  # shown by GET /health while loading
        state.progress = LoadProgress(stage=stage, done=done, total=total, elapsed_s=round(time.monotonic() - t0, 1))

    try:
        index = await asyncio.to_thread(loader, s, report)
    except Exception as e:  # process boundary: report through /health instead of dying silently
        logger.exception("loading the %s index failed", s.method.value)
        state.error = f"{type(e).__name__}: {e}"
        return
    batcher = QueryBatcher(
        index.retriever,
        s.batch_max_queries,
        s.batch_max_wait_ms / 1000,
        state.metrics,
        s.batch_wait_fraction,
        max_chars=s.batch_max_chars,
        max_queue_wait_s=s.max_queue_wait_s,
    )
    batcher.start()
    state.index = index
    state.service = SearchService(index.documents, batcher, s.method.value, s.cache_size, state.metrics)
    state.metrics.documents.set(len(index.documents))
    state.metrics.ready.set(1)
    logger.info("retriever ready: %s over %d documents", s.method.value, len(index.documents))


def document_limits(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Write ``max_queries_per_request``, ``max_query_chars`` and ``max_topk`` into ``RetrieveRequest``."""
    props = schema["components"]["schemas"]["RetrieveRequest"]["properties"]
    props["queries"]["maxItems"] = settings.max_queries_per_request
    props["queries"]["items"]["maxLength"] = settings.max_query_chars
    for option in props["topk"].get("anyOf", [props["topk"]]):
        if option.get("type") == "integer":
            option["maximum"] = settings.max_topk
    return schema


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Serve the generated document with the limits of ``settings`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = document_limits(schema, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None, loader: IndexLoader = load_local_index) -> FastAPI:
    """Build the app; the index loads in the background once the server starts.

    Args:
        loader: loads the index (in a worker thread); the Ray Serve ingress passes one that fans out to its shards,
            so both servers share every route, limit, error answer, guard, cache and the load shedding.
    """
    state = AppState(settings=settings or get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        loading = asyncio.create_task(_load(state, loader))
        yield
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
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
