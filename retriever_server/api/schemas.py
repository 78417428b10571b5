"""Request and response bodies of ``POST /retrieve`` (Search-R1's contract) and ``GET /health``."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
)

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


def _whole_number(value: object, info: ValidationInfo) -> object:
    """Take a JSON number without a fractional part as an integer (``54.0`` -> 54), as JSON Schema's ``integer``
    does: clients that write every number as a float send such values. Refuse ``54.5``, NaN, infinities and
    booleans by name; strings and other types go on to ``StrictInt``, which refuses them."""
    if isinstance(value, bool):
        raise ValueError(f"{info.field_name} must be a whole number, not the boolean {str(value).lower()}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{info.field_name} must be a whole number; {value!r} is not")
        return int(value)
    return value


Query = Annotated[
    StrictStr, Field(json_schema_extra={"minLength": 1, "pattern": HAS_TEXT}), AfterValidator(_check_query)
]


class RetrieveRequest(BaseModel):
    """``{"queries": [str], "topk": int?, "return_scores": bool}``; unknown fields are rejected by name.

    The configured limits (queries per request, characters per query, largest top-k) are checked by the route and
    written into the OpenAPI document by ``app.document_limits``.
    """

    model_config = ConfigDict(extra="forbid")

    queries: list[Query]
    # 3 and 3.0 are 3; 3.5, NaN, 1e400, true and "3" are refused. (The bound goes before the validator: after it,
    # pydantic writes "ge" into the JSON schema instead of "minimum".)
    topk: Annotated[StrictInt, Field(ge=1), BeforeValidator(_whole_number)] | None = None
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


MAX_DOCUMENT_IDS = 64
"""Most ids in one ``POST /documents`` request."""
MAX_ARTICLE_CHARS = 100_000
"""Largest ``max_chars`` of one ``POST /documents`` request."""


class DocumentsRequest(BaseModel):
    """``{"ids": [str], "max_chars": int}``: the articles of documents by id, each cut to ``max_chars`` characters."""

    model_config = ConfigDict(extra="forbid")

    ids: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=256)]],
        Field(min_length=1, max_length=MAX_DOCUMENT_IDS),
    ]
    max_chars: Annotated[StrictInt, Field(ge=1, le=MAX_ARTICLE_CHARS), BeforeValidator(_whole_number)] = 4000


class Article(BaseModel):
    """A document's whole article: the run of corpus rows around it that share its title, in corpus order."""

    id: str
    """The id asked for."""
    title: str
    text: str
    """The rows' texts joined by a space, cut to ``max_chars`` characters."""
    passages: int
    """Corpus rows the article spans."""
    truncated: bool
    """The text was cut to ``max_chars``."""


class DocumentsResponse(BaseModel):
    """One entry per id, in order: its article, or null for an id the corpus does not have."""

    result: list[Article | None]


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


class ShardInfo(BaseModel):
    """One shard of a Ray Serve index."""

    index: str
    """The shard's index file name."""
    rows: int
    offset: int
    """The shard's first global corpus row."""
    node: str
    """The Ray node of the replica that answered."""


class Health(BaseModel):
    """What the server searches, and whether it is ready. ``corpus_sha256``, ``index_key`` and ``search_settings``
    identify its answers: two servers that report the same three answer the same queries the same way."""

    status: Literal["loading", "ready", "failed"]
    method: str
    num_documents: int | None = None
    index_path: str | None = None
    """The index folder's or file's name (no directories)."""
    encoder_model: str | None = None
    corpus_sha256: str | None = None
    """sha256 of the corpus file's bytes (once ready)."""
    index_key: str | None = None
    """Changes with the index's content or build settings (``retriever_server.identity``; once ready)."""
    search_settings: dict[str, str | int | float | bool | None] | None = None
    """The search-time settings that change answers: nprobe, efSearch, query prefix, encoder, RRF's k, default top-k."""
    shards: list[ShardInfo] | None = None
    """Ray Serve: the shards, in row order."""
    error: str | None = None
    progress: LoadProgress | None = None
    """While loading: the build step under way (e.g. ``encoding corpus``, 2048 of 16430 passages)."""
