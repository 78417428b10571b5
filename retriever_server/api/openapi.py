"""The OpenAPI document (``GET /openapi.json``) with the configured request limits written in.

The limits are settings, checked by the route rather than declared on the model, so FastAPI's generated schema would
accept 2,000 queries or ``topk: 500`` that the server then refuses. Filling them in keeps the document and the server
in agreement (a schemathesis run in the tests checks it).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from retriever_server.settings import Settings


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
