"""FastAPI dependencies: the app state and the ready search service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from retriever_server.service import SearchService
from retriever_server.state import AppState


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.retriever
    return state


def get_service(state: Annotated[AppState, Depends(get_state)]) -> SearchService:
    """The loaded service, or 503 while the index is loading or after loading failed."""
    if state.service is None:
        detail = f"index failed to load: {state.error}" if state.error else "index is loading; poll GET /health"
        raise HTTPException(status_code=503, detail=detail)
    return state.service


StateDep = Annotated[AppState, Depends(get_state)]
ServiceDep = Annotated[SearchService, Depends(get_service)]
