"""What a retriever's answers depend on, as ``GET /health`` reports it: the corpus, the index and the search settings.

A client that records the three (the trainer does, with every run and evaluation) can tell whether two runs searched
the same thing. ``index_key`` changes with the index's content and build settings:

- an index the server builds: the name of the folder it is cached under, ``dense-<key>`` or ``bm25-<key>``
  (``index.build.index_key`` hashes the corpus, the encoder, the passage prefix and the FAISS factory or BM25 k1/b);
- a ``RETRIEVER_PREBUILT_INDEX`` file: ``prebuilt-<sha256 of the file>``, computed once and cached (see
  :func:`file_sha256`);
- hybrid: the dense and BM25 keys joined by ``+``; the Ray Serve deployment: ``shards-<hash of every shard's file hash
  and first row>``.

``search_settings`` holds the search-time knobs that change answers without changing the index (nprobe, efSearch,
the query prefix, the encoder and its backend, RRF's k, the default top-k): only those of the configured method.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from retriever_server.index.build import index_path
from retriever_server.index.corpus import Corpus
from retriever_server.redaction import without_paths
from retriever_server.retrievers.encoder import resolve_backend
from retriever_server.settings import Method, Settings

logger = logging.getLogger(__name__)

SearchValue = str | int | float | bool | None
ProgressFn = Callable[[str, int, int], None]

HASH_CHUNK_BYTES = 8 << 20
"""Bytes read per step while hashing a file (progress is reported after each)."""
SHA_SUFFIX = ".sha256"
"""``<file>.sha256`` beside a hashed file caches its hash (JSON: size, mtime_ns, sha256)."""


def _no_progress(stage: str, done: int, total: int) -> None:
    del stage, done, total


@dataclass(frozen=True)
class IndexIdentity:
    """The corpus and index a server searches."""

    corpus_sha256: str
    """sha256 of the corpus file's bytes (sharded: of the shards' corpus hashes, unless all shards share one)."""
    index_key: str
    """Changes with the index's content or build settings (module docstring)."""
    index_name: str | None
    """What ``/health`` shows as ``index_path``: the index folder's or file's name, never a full path."""


def search_settings(settings: Settings) -> dict[str, SearchValue]:
    """The search-time settings of ``settings.method`` that change answers (module docstring).

    >>> search_settings(Settings(method="bm25", default_topk=5))
    {'method': 'bm25', 'default_topk': 5}
    """
    out: dict[str, SearchValue] = {"method": settings.method.value, "default_topk": settings.default_topk}
    if settings.method is not Method.bm25:
        query_prefix, _ = settings.resolved_prefixes()
        out |= {
            "encoder_model": without_paths(settings.encoder_model),
            "encoder_backend": resolve_backend(
                settings.encoder_backend, settings.encoder_model, settings.encoder_device
            ).value,
            "query_prefix": query_prefix,
            "ivf_nprobe": settings.ivf_nprobe,
            "hnsw_ef_search": settings.hnsw_ef_search,
        }
    if settings.method is Method.hybrid:
        out |= {"rrf_k": settings.rrf_k, "hybrid_candidates": settings.hybrid_candidates}
    return out


def index_identity(corpus: Corpus, settings: Settings, progress: ProgressFn = _no_progress) -> IndexIdentity:
    """The identity of the index a one-process server loads for ``settings`` over ``corpus`` (module docstring).

    A prebuilt file is hashed the first time (``progress`` reports it); its hash is cached beside it.
    """
    keys: list[str] = []
    names: list[str] = []
    if settings.method is not Method.bm25:
        if settings.prebuilt_index is not None:
            keys.append(f"prebuilt-{file_sha256(settings.prebuilt_index, settings.index_dir, progress)}")
            names.append(settings.prebuilt_index.name)
        else:
            keys.append(index_path(corpus, Method.dense, settings).name)
    if settings.method is not Method.dense:
        keys.append(index_path(corpus, Method.bm25, settings).name)
    return IndexIdentity(corpus.sha256, "+".join(keys), (names or keys)[0])


def shards_identity(shards: list[dict[str, object]]) -> IndexIdentity:
    """The identity of a sharded index, from each shard's ``offset``, ``index`` (file name), ``index_sha256`` and
    ``corpus_sha256``."""
    corpora = sorted({str(s["corpus_sha256"]) for s in shards})
    corpus = corpora[0] if len(corpora) == 1 else hashlib.sha256("\n".join(corpora).encode()).hexdigest()
    parts = [(int(str(s["offset"])), str(s["index_sha256"])) for s in shards]
    key = hashlib.sha256(json.dumps(sorted(parts)).encode()).hexdigest()
    return IndexIdentity(corpus, f"shards-{key}", ",".join(str(s["index"]) for s in shards))


def file_sha256(path: Path, cache_dir: Path, progress: ProgressFn = _no_progress) -> str:
    """sha256 of a file's bytes, hashed once and cached.

    The hash is kept in ``<file>.sha256`` beside the file (JSON with its size and mtime), or, where that folder is
    read-only or already holds another ``.sha256`` file, under ``cache_dir/file-sha256/``. It is hashed again when
    the file's size or mtime differs from the cached ones. Hashing a 65 GB index takes minutes: it reports
    ``("hashing index file", bytes done, bytes total)`` to ``progress``.
    """
    path = Path(path)
    stat = path.stat()
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    beside = path.with_name(path.name + SHA_SUFFIX)
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    fallback = cache_dir / "file-sha256" / f"{path.name}-{name}{SHA_SUFFIX}"
    fallback.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(fallback) + ".lock"):  # one worker hashes, the others wait and read its answer
        for cached in (beside, fallback):
            record = _read_record(cached)
            if record is not None and all(record.get(k) == v for k, v in stamp.items()):
                return str(record["sha256"])
        digest = _hash_file(path, stat.st_size, progress)
        record = {**stamp, "sha256": digest}
        ours = not beside.exists() or _read_record(beside) is not None
        if not (ours and _write_record(beside, record)):
            _write_record(fallback, record)
    return digest


def _hash_file(path: Path, size: int, progress: ProgressFn) -> str:
    logger.info("hashing %s (%.1f GB) once, for GET /health's index_key", path, size / 1e9)
    sha = hashlib.sha256()
    done = 0
    progress("hashing index file", 0, size)
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            sha.update(chunk)
            done += len(chunk)
            progress("hashing index file", done, size)
    return sha.hexdigest()


def _read_record(path: Path) -> dict[str, object] | None:
    """A cached hash record, or None when the file is missing or is not one of ours (e.g. ``sha256sum`` output)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not {"size", "mtime_ns", "sha256"} <= record.keys():
        return None
    return record


def _write_record(path: Path, record: dict[str, object]) -> bool:
    """Write ``record`` atomically; False where the folder is read-only."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True
