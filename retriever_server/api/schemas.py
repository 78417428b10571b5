"""Request and response bodies of ``POST /retrieve`` (Search-R1's contract) and ``GET /health``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

# A query must contain a character this pattern matches. Python's \s and JSON Schema's (ECMA-262) differ on exactly
# \x1c-\x1f, \x85 and \ufeff; naming them makes the pattern mean the same to the server and to any client that
# validates against the OpenAPI document.
HAS_TEXT = r"[^\s\x1c-\x1f\x85\ufeff]"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_query(q: str) -> str:
    """Reject text no backend can take: lone UTF-16 surrogates (a JSON ``"\\ud800"`` escape without its pair, which
    the dense tokenizer raises on) and queries without a visible character."""
    if bad := _SURROGATE.search(q):
        raise ValueError(
            f"character {bad.start()} is a lone UTF-16 surrogate (\\u{ord(bad.group()):04x}), which is not valid "
            "Unicode; send UTF-8 text, or pair each \\ud800-\\udbff escape with a \\udc00-\\udfff one"
        )
    if not re.search(HAS_TEXT, q):
        raise ValueError("query is empty or only whitespace; every query needs text")
    return q


Query = Annotated[
    StrictStr, Field(json_schema_extra={"minLength": 1, "pattern": HAS_TEXT}), AfterValidator(_check_query)
]


class RetrieveRequest(BaseModel):
    """``{"queries": [str], "topk": int?, "return_scores": bool}``; unknown fields are rejected by name.

    The configured limits (queries per request, characters per query, largest top-k) are checked by the route and
    written into the OpenAPI document by ``openapi.document_limits``.
    """

    model_config = ConfigDict(extra="forbid")

    queries: list[Query]
    topk: StrictInt | None = Field(default=None, ge=1)
    return_scores: StrictBool = False


class Document(BaseModel):
    """A corpus row as Search-R1 returns it; ``contents`` is ``"Title"\\ntext``."""

    id: str
    contents: str


class ScoredDocument(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    """One list per query, best first: scored documents if ``return_scores`` else bare documents."""

    result: list[list[ScoredDocument]] | list[list[Document]]


class ErrorMessage(BaseModel):
    """Every error answer but 422 (whose ``detail`` is FastAPI's list of field errors)."""

    detail: str


class LoadProgress(BaseModel):
    """Where loading the index stands: the current step and how far it got (``done`` of ``total`` items)."""

    stage: str
    done: int
    total: int
    elapsed_s: float
    """Seconds since loading started."""


class Health(BaseModel):
    status: Literal["loading", "ready", "failed"]
    method: str
    num_documents: int | None = None
    index_path: str | None = None
    encoder_model: str | None = None
    error: str | None = None
    progress: LoadProgress | None = None
    """While loading: the build step under way (e.g. ``encoding corpus``, 2048 of 16430 passages)."""
