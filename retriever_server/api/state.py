"""What the app holds while it runs (settings, metrics and, once loaded, the index and the search service) and the
FastAPI dependencies that hand it to the routes: ``StateDep``, and ``ServiceDep`` (503 until the index is ready)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from retriever_server.api.metrics import ServiceMetrics
from retriever_server.api.schemas import LoadProgress, ShardInfo
from retriever_server.api.service import Documents, SearchService
from retriever_server.identity import IndexIdentity
from retriever_server.redaction import without_paths
from retriever_server.retrievers.base import Retriever
from retriever_server.settings import Settings

LOADING_RETRY_S = 5
"""``Retry-After`` of a 503 while the index loads."""

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: what loading is doing, shown by ``GET /health``."""


@dataclass(frozen=True)
class LoadedIndex:
    """What an index loader hands the app: where hits come from, their documents, and what ``/health`` reports."""

    documents: Documents
    retriever: Retriever
    identity: IndexIdentity
    shards: list[ShardInfo] | None = None
    """Ray Serve: each shard's rows and node."""


IndexLoader = Callable[[Settings, ProgressFn], LoadedIndex]
"""Loads (or builds) the index in a worker thread; the one-process server's is ``app.load_local_index``."""


@dataclass
class AppState:
    settings: Settings
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    service: SearchService | None = None
    index: LoadedIndex | None = None
    error: str | None = None
    """Why loading failed, if it did."""
    progress: LoadProgress | None = None
    """While loading: the step under way and how far it got (written by the loading thread)."""


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.retriever
    return state


def get_service(state: Annotated[AppState, Depends(get_state)]) -> SearchService:
    """The loaded service, or 503 while the index is loading or after loading failed."""
    if state.service is None:
        if state.error:
            raise HTTPException(status_code=503, detail=f"index failed to load: {without_paths(state.error)}")
        raise HTTPException(503, "index is loading; poll GET /health", headers={"Retry-After": str(LOADING_RETRY_S)})
    return state.service


StateDep = Annotated[AppState, Depends(get_state)]
ServiceDep = Annotated[SearchService, Depends(get_service)]
