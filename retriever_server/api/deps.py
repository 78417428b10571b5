"""FastAPI dependencies: the app state and the ready search service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from retriever_server.api.service import SearchService
from retriever_server.api.state import AppState
from retriever_server.redaction import without_paths

LOADING_RETRY_S = 5
"""``Retry-After`` of a 503 while the index loads."""


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
