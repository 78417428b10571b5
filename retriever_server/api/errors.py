"""Error answers: 422s that JSON can carry, 503 with ``Retry-After`` under overload, backend failures as JSON."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from retriever_server.api.batching import Overloaded, SearchFailed


def json_safe(value: Any) -> Any:
    """``value`` with what JSON cannot carry made printable: non-finite floats as their JavaScript names, lone
    surrogates as ``\\\\udXXX`` text. FastAPI's 422 echoes the input, and ``NaN`` or ``"\\\\ud800"`` in it made the
    answer itself fail (a 500).

    >>> json_safe({"topk": float("nan"), "queries": ["a\\ud800", float("-inf")]})
    {'topk': 'NaN', 'queries': ['a\\\\ud800', '-Infinity']}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


async def _overloaded(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Overloaded)
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after_s)})


async def _search_failed(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": json_safe(str(exc))}, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers above on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(SearchFailed, _search_failed)
