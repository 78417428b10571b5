"""HTTP routes: ``POST /retrieve``, ``GET /health``, ``GET /metrics``."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from retriever_server.deps import ServiceDep, StateDep
from retriever_server.schemas import Health, RetrieveRequest, RetrieveResponse

router = APIRouter()


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


@router.post("/retrieve", response_model=RetrieveResponse)
async def retrieve(req: RetrieveRequest, state: StateDep, service: ServiceDep) -> Response:
    """Top-k documents per query, in Search-R1's response shape."""
    topk = _check_limits(req, state)
    state.metrics.queries.inc(len(req.queries))
    hits = await service.search(req.queries, topk)
    doc = service.corpus.document
    if req.return_scores:
        result: list[list[dict]] = [[{"document": doc(p), "score": s} for p, s in row] for row in hits]
    else:
        result = [[doc(p) for p, _ in row] for row in hits]
    # The dicts already have the response's exact shape: skip re-validating thousands of nested models and
    # serialise with orjson (several times faster than json for these bodies).
    return Response(orjson.dumps({"result": result}), media_type="application/json")


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(state: StateDep) -> JSONResponse:
    """200 with index facts once ready; 503 while loading or after a failed load."""
    s = state.settings
    body = Health(
        status="loading", method=s.method.value, encoder_model=s.encoder_model if s.method != "bm25" else None
    )
    if state.service is not None:
        body.status, body.num_documents, body.index_path = "ready", len(state.service.corpus), state.index_path
    elif state.error is not None:
        body.status, body.error = "failed", state.error
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ready" else 503)


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
