"""HTTP routes: ``POST /retrieve``, ``POST /documents``, ``GET /health``, ``GET /metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from retriever_server.api.schemas import (
    DocumentsRequest,
    DocumentsResponse,
    ErrorMessage,
    Health,
    RetrieveRequest,
    RetrieveResponse,
)
from retriever_server.api.state import ServiceDep, StateDep
from retriever_server.identity import search_settings
from retriever_server.redaction import without_paths

router = APIRouter()
T = TypeVar("T")

_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}}
RETRIEVE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorMessage, "description": "Host not allowed, or a body that is not UTF-8 / too deeply nested"},
    403: {"model": ErrorMessage, "description": "Sent by a web page of another site (Origin)"},
    408: {"model": ErrorMessage, "description": "Body not received within RETRIEVER_REQUEST_TIMEOUT_S"},
    413: {"model": ErrorMessage, "description": "Body over RETRIEVER_MAX_BODY_BYTES"},
    415: {"model": ErrorMessage, "description": "Body not declared as application/json"},
    500: {"model": ErrorMessage, "description": "The search backend failed on this request's own queries"},
    503: {"model": ErrorMessage, "description": "Index loading, or overloaded (shed)", "headers": _RETRY_AFTER},
}


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body has been read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``; if the client goes away first, cancel it (the batcher drops its queries) and return None."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it any more
    return task.result() if task.done() else None


def _check_limits(req: RetrieveRequest, state: StateDep) -> int:
    """Apply the configured limits; return the top-k to use. Violations are 422s naming the field."""
    s = state.settings
    errors: list[dict[str, object]] = []
    topk = req.topk if req.topk is not None else s.default_topk
    if topk > s.max_topk:
        errors.append(
            {"loc": ("body", "topk"), "msg": f"topk={topk} is above the maximum {s.max_topk}", "type": "value_error"}
        )
    if len(req.queries) > s.max_queries_per_request:
        msg = f"{len(req.queries)} queries in one request; the maximum is {s.max_queries_per_request}"
        errors.append({"loc": ("body", "queries"), "msg": msg, "type": "value_error"})
    for i, q in enumerate(req.queries):
        if len(q) > s.max_query_chars:
            msg = f"query has {len(q)} characters; the maximum is {s.max_query_chars}"
            errors.append({"loc": ("body", "queries", i), "msg": msg, "type": "value_error"})
            break
    if errors:
        raise RequestValidationError(errors)
    return topk


@router.post("/retrieve", response_model=RetrieveResponse, responses=RETRIEVE_ERRORS)
async def retrieve(req: RetrieveRequest, request: Request, state: StateDep, service: ServiceDep) -> Response:
    """Top-k documents per query, in Search-R1's response shape."""
    topk = _check_limits(req, state)
    state.metrics.queries.inc(len(req.queries))
    hits = await _unless_disconnected(request, service.search(req.queries, topk))
    if hits is None:
        return Response(status_code=499)  # client closed the request (nginx's code): nobody reads this
    docs = await service.documents.rows(hits)
    if req.return_scores:
        result: list[list[dict]] = [
            [{"document": d, "score": s} for d, (_, s) in zip(drow, row, strict=True)]
            for drow, row in zip(docs, hits, strict=True)
        ]
    else:
        result = docs
    # The dicts already have the response's exact shape: skip re-validating thousands of nested models and
    # serialise with orjson (several times faster than json for these bodies).
    return Response(orjson.dumps({"result": result}), media_type="application/json")


@router.post("/documents", response_model=DocumentsResponse, responses=RETRIEVE_ERRORS)
async def documents(req: DocumentsRequest, service: ServiceDep) -> Response:
    """The whole article of each document id (the ``open`` tool of the rollout), cut to ``max_chars`` characters;
    null for an id the corpus does not have. A sharded index joins an article that crosses shards."""
    found = await service.documents.articles(req.ids, req.max_chars)
    return Response(orjson.dumps({"result": found}), media_type="application/json")


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(state: StateDep) -> JSONResponse:
    """200 with what the server searches once ready; 503 while loading (with the build's progress) or after a failed
    load. ``corpus_sha256``, ``index_key`` and ``search_settings`` identify its answers (``identity.py``)."""
    s = state.settings
    body = Health(
        status="loading",
        method=s.method.value,
        encoder_model=without_paths(s.encoder_model) if s.method != "bm25" else None,
        search_settings=search_settings(s),
    )
    if state.service is not None and state.index is not None:
        body.status, body.num_documents, body.shards = "ready", len(state.service.documents), state.index.shards
        ident = state.index.identity
        body.index_path, body.corpus_sha256, body.index_key = ident.index_name, ident.corpus_sha256, ident.index_key
    elif state.error is not None:
        body.status, body.error = "failed", without_paths(state.error) + " (full message in the server log)"
    else:
        body.progress = state.progress
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ready" else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: StateDep) -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
