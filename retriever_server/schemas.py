"""Request and response bodies of ``POST /retrieve`` (Search-R1's contract) and ``GET /health``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator


class RetrieveRequest(BaseModel):
    """``{"queries": [str], "topk": int?, "return_scores": bool}``; unknown fields are rejected by name."""

    model_config = ConfigDict(extra="forbid")

    queries: list[StrictStr]
    topk: StrictInt | None = Field(default=None, ge=1)
    return_scores: StrictBool = False

    @field_validator("queries")
    @classmethod
    def _no_blank_queries(cls, queries: list[str]) -> list[str]:
        for i, q in enumerate(queries):
            if not q.strip():
                raise ValueError(f"queries[{i}] is empty or whitespace; every query needs text")
        return queries


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


class Health(BaseModel):
    status: Literal["loading", "ready", "failed"]
    method: str
    num_documents: int | None = None
    index_path: str | None = None
    encoder_model: str | None = None
    error: str | None = None
