"""Every knob of the retriever service, read from ``RETRIEVER_*`` environment variables or a ``.env`` file.

Example::

    RETRIEVER_METHOD=bm25 RETRIEVER_DEFAULT_TOPK=5 uvicorn retriever_server.app:app
"""

from __future__ import annotations

import os
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CORPUS = REPO_ROOT / "data" / "corpus" / "wiki_mini.jsonl.gz"
"""The corpus the repository ships (the server's default ``corpus_path``; data_prep builds it)."""
DEFAULT_HOST = "127.0.0.1"
"""Address the server binds to unless ``RETRIEVER_HOST`` says otherwise (loopback only)."""
DEFAULT_PORT = 8000
"""Port the server listens on unless ``RETRIEVER_PORT`` says otherwise (Search-R1's retriever uses it too)."""
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
"""Base URL of a server started with the defaults on this machine: where clients look unless told otherwise."""
DEFAULT_ENCODER = "all-MiniLM-L6-v2"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/search-rl`` (``~/.cache/search-rl`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "search-rl"


class Method(StrEnum):
    """Retrieval backends."""

    dense = "dense"
    bm25 = "bm25"
    hybrid = "hybrid"


class EncoderBackend(StrEnum):
    """What runs the query encoder (docs/retriever.md, "Encoder backends")."""

    auto = "auto"
    """``onnx`` for an encoder whose export was checked against torch's embeddings (the shipped all-MiniLM-L6-v2)
    when it runs on CPU and onnxruntime is installed; otherwise ``torch``."""
    torch = "torch"
    """sentence-transformers itself, on ``encoder_device`` (CPU or GPU)."""
    onnx = "onnx"
    """An fp32 ONNX export run by onnxruntime on CPU."""
    onnx_int8 = "onnx-int8"
    """The ONNX export with dynamically int8-quantized weights, on CPU."""


class Settings(BaseSettings):
    """Retriever service settings. Each field is set by the env var ``RETRIEVER_<FIELD NAME IN CAPS>``."""

    model_config = SettingsConfigDict(env_prefix="RETRIEVER_", env_file=".env", extra="ignore")

    corpus_path: Path = SHIPPED_CORPUS
    """Corpus jsonl (optionally .gz), one ``{"id", "contents"}`` row per line, or a converted document-store folder.
    A jsonl is converted once into a memory-mapped store (``docstore_dir``) that every worker shares."""
    docstore_dir: Path | None = None
    """Where jsonl corpora are converted into memory-mapped document stores; ``None`` = ``<index_dir>/docstores``."""
    index_dir: Path = Field(default_factory=lambda: default_cache_dir() / "indexes")
    """Where built indexes are cached, one sub-folder per hash of corpus + method + encoder + index settings."""
    method: Method = Method.dense
    """``dense`` (FAISS over sentence-transformers embeddings), ``bm25`` (bm25s) or ``hybrid`` (both, fused by RRF)."""
    encoder_model: str = DEFAULT_ENCODER
    """sentence-transformers model: a local folder, a hub name, or ``all-MiniLM-L6-v2`` (shipped on PyPI)."""
    encoder_device: str = "cpu"
    """Where the encoder runs: ``cpu``, ``cuda`` (``cuda:1``...), or ``auto`` (the GPU when there is one)."""
    encoder_backend: EncoderBackend = EncoderBackend.auto
    """What encodes queries: ``auto``, ``torch``, ``onnx`` or ``onnx-int8`` (the ONNX ones on CPU only, exported once
    into the user cache's ``indexes/encoders``). Passages (index builds) are always encoded by torch."""
    encoder_threads: int | None = Field(default=None, ge=1)
    """Intra-op threads of the query encoder; ``None`` = ``torch_threads`` (all cores when that is unset too)."""
    query_prefix: str | None = None
    """Text put before each query when encoding; ``None`` = automatic (``query: `` for e5 models, else none)."""
    passage_prefix: str | None = None
    """Text put before each passage when encoding; ``None`` = automatic (``passage: `` for e5 models, else none)."""
    index_factory: str = "Flat"
    """FAISS index-factory string, e.g. ``Flat``, ``HNSW32``, ``IVF256,PQ16``; always inner product on unit vectors."""
    hnsw_ef_search: int = Field(default=128, ge=1)
    """efSearch for HNSW indexes (ignored by others)."""
    ivf_nprobe: int = Field(default=16, ge=1)
    """nprobe for IVF indexes (ignored by others)."""
    index_mmap: bool = True
    """Memory-map the FAISS index file (codes, inverted lists, HNSW graph) instead of reading it onto the heap, so
    every worker process shares one copy through the page cache."""
    prebuilt_index: Path | None = None
    """A FAISS index file served as it is (e.g. Search-R1's ``e5_Flat.index``): vector i must be corpus row i (the
    counts are checked), built with the configured encoder and passage prefix. Nothing is built or cached."""
    encode_batch_size: int = Field(default=128, ge=1)
    """Passages per encoder batch when building the dense index."""
    query_batch_size: int = Field(default=32, ge=1)
    """Queries per encoder forward pass. Queries are sorted by length first, so small passes pad less: on 2 cores
    32 encoded mixed-length questions about 1.7x faster than 128 (bench/README.md)."""
    bm25_k1: float = Field(default=0.9, gt=0)
    """BM25 k1 (term-frequency saturation); 0.9 is Pyserini's default."""
    bm25_b: float = Field(default=0.4, ge=0, le=1)
    """BM25 b (length normalisation); 0.4 is Pyserini's default."""
    rrf_k: int = Field(default=60, ge=1)
    """Reciprocal-rank-fusion constant for ``hybrid``: score = sum over rankers of 1 / (rrf_k + rank)."""
    hybrid_candidates: int = Field(default=50, ge=1)
    """How many candidates each ranker contributes before fusion in ``hybrid``."""
    default_topk: int = Field(default=3, ge=1)
    """Top-k used when a request gives none."""
    max_topk: int = Field(default=100, ge=1)
    """Largest top-k a request may ask for (larger is a 422)."""
    max_queries_per_request: int = Field(default=1024, ge=1)
    """Most queries in one request (more is a 422)."""
    max_query_chars: int = Field(default=2048, ge=1)
    """Longest query string accepted (longer is a 422)."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body accepted (larger is a 413)."""
    batch_max_queries: int = Field(default=256, ge=1)
    """Concurrent requests are coalesced into one encoder + index batch of at most this many queries."""
    batch_max_wait_ms: float = Field(default=50.0, ge=0)
    """Longest a batch waits for more queries before it starts (see ``batch_wait_fraction``)."""
    batch_wait_fraction: float = Field(default=0.3, ge=0)
    """A batch waits for as many queries as the previous batch served, but at most this fraction of the previous
    batch's search time (and at most ``batch_max_wait_ms``); 0 starts every batch at once."""
    cache_size: int = Field(default=10_000, ge=0)
    """LRU cache entries of (query, top-k, method) results; 0 turns the cache off."""
    torch_threads: int | None = Field(default=None, ge=1)
    """Threads for the encoder and FAISS; ``None`` = all cores."""
    show_progress: bool = True
    """Show progress bars while building an index."""
    batch_max_chars: int = Field(default=16_384, ge=1)
    """Most query characters in one batch (a batch holds at least one query): bounds how long one batch runs, and
    so how long a small request waits behind a large one."""
    max_queue_wait_s: float = Field(default=20.0, gt=0)
    """A request whose estimated wait for the search worker is above this is refused at once with 503 and
    ``Retry-After``, instead of queueing past the client's timeout (the trainer's is 30 s)."""
    host: str = DEFAULT_HOST
    """Address ``python -m retriever_server`` binds to; also accepted as a ``Host`` header."""
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    """Port ``python -m retriever_server`` listens on."""
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Extra names or IPs accepted in the ``Host`` header, comma-separated (``*`` = any). Loopback names, the
    bind host and the address a request arrived on are always accepted; others get 400, so a web page in the
    user's browser cannot reach the retriever through DNS rebinding."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """A request's headers and body must arrive within this many seconds, else the connection is closed (408)."""

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return [h.strip().lower() for h in value.split(",") if h.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.default_topk > self.max_topk:
            raise ValueError(f"default_topk={self.default_topk} is above max_topk={self.max_topk}")
        return self

    def docstore_root(self) -> Path:
        """Folder of converted document stores."""
        return self.docstore_dir if self.docstore_dir is not None else self.index_dir / "docstores"

    def resolved_prefixes(self) -> tuple[str, str]:
        """(query prefix, passage prefix), with the e5 convention applied when not set explicitly."""
        is_e5 = "e5" in Path(self.encoder_model).name.lower()
        q = self.query_prefix if self.query_prefix is not None else ("query: " if is_e5 else "")
        p = self.passage_prefix if self.passage_prefix is not None else ("passage: " if is_e5 else "")
        return q, p


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
