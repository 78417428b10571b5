"""Passage embeddings shipped in the repository, so the first dense start loads vectors instead of encoding.

Encoding the shipped corpus (16,430 passages) with MiniLM takes about 8 minutes on 2 cores; loading its shipped
float16 embeddings and building the FAISS index from them takes seconds. One set lives in a folder
(``data/index/wiki_mini/`` for the shipped corpus)::

    MANIFEST.json        corpus sha256, encoder (name, fingerprint, passage prefix), rows, dim, parts and their sha256
    embeddings-000.npy   float16 (rows, dim) slices of at most ``PART_ROWS`` rows (3.8 MB each: no file over 5 MB)

A set is used only when everything that decides the vectors matches: the corpus file's sha256, the encoder's
fingerprint (sha256 of its local model files) and passage prefix, every part's sha256 and shape, and a spot check
that re-encodes a few passages and finds the stored vectors within float16 rounding. Anything else logs why and
the index is built by encoding, as if nothing were shipped. Make a set with::

    python -m retriever_server.index.build --corpus data/corpus/wiki_mini.jsonl.gz --method dense \\
        --out ~/.cache/search-rl/indexes --export-shipped data/index/wiki_mini
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from retriever_server.index.corpus import Corpus
from retriever_server.passages import file_sha256
from retriever_server.retrievers.encoder import Encoder, encoder_fingerprint
from retriever_server.settings import REPO_ROOT, Settings

logger = logging.getLogger(__name__)

SHIPPED_EMBEDDINGS_DIR = REPO_ROOT / "data" / "index"
"""Where shipped sets are looked for: every ``*/MANIFEST.json`` below it."""
FORMAT_VERSION = 1
PART_ROWS = 5000
"""Rows per part: 5000 x 384 dims x 2 bytes = 3.84 MB, under the repository's 5 MB file limit."""
SPOT_CHECK_ROWS = 8
MIN_SPOT_COSINE = 0.999
"""float16 rounding costs a cosine of about 1e-7 (at most 2e-7 on the shipped set); another encoder costs far more."""


class EmbeddingsMismatch(ValueError):
    """A shipped set does not belong to this corpus and encoder, or its files are damaged; the message says how."""


def _shown(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def _encoder_entry(settings: Settings) -> dict[str, Any]:
    _, passage_prefix = settings.resolved_prefixes()
    return {
        "model": settings.encoder_model,
        "fingerprint": encoder_fingerprint(settings.encoder_model),
        "passage_prefix": passage_prefix,
        "normalized": True,
    }


def write_embeddings(embeddings: np.ndarray, corpus: Corpus, settings: Settings, out: Path) -> Path:
    """Write ``embeddings`` (float32, one unit row per passage) as a shipped float16 set in ``out``.

    Raises:
        ValueError: the row count differs from the corpus, or the encoder has no local files to fingerprint.
    """
    if embeddings.shape[0] != len(corpus):
        raise ValueError(f"{embeddings.shape[0]} embeddings for a corpus of {len(corpus)} passages")
    encoder = _encoder_entry(settings)
    if encoder["fingerprint"] is None:
        raise ValueError(f"encoder {settings.encoder_model!r} is not a local folder; shipped sets need one to verify")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("embeddings-*.npy"):
        old.unlink()
    parts = []
    half = embeddings.astype(np.float16)
    for i, start in enumerate(range(0, len(half), PART_ROWS)):
        f = out / f"embeddings-{i:03d}.npy"
        np.save(f, np.ascontiguousarray(half[start : start + PART_ROWS]))
        parts.append({"file": f.name, "rows": int(min(PART_ROWS, len(half) - start)), "sha256": file_sha256(f)})
    manifest = {
        "format_version": FORMAT_VERSION,
        "description": (
            "float16 passage embeddings of the corpus below; see retriever_server/index/shipped_embeddings.py"
        ),
        "command": (
            f"python -m retriever_server.index.build --corpus {_shown(corpus.path)} --method dense "
            f"--out ~/.cache/search-rl/indexes --export-shipped {_shown(out)}"
        ),
        "corpus": {"file": _shown(corpus.path), "sha256": corpus.sha256, "rows": len(corpus)},
        "encoder": encoder,
        "dtype": "float16",
        "rows": int(half.shape[0]),
        "dim": int(half.shape[1]),
        "parts": parts,
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %d x %d float16 embeddings in %d parts to %s", *half.shape, len(parts), out)
    return out


def find_set(corpus: Corpus, root: Path = SHIPPED_EMBEDDINGS_DIR) -> Path | None:
    """The folder under ``root`` whose manifest names this corpus's sha256, if any."""
    for manifest in sorted(root.glob("*/MANIFEST.json")):
        try:
            if json.loads(manifest.read_text(encoding="utf-8"))["corpus"]["sha256"] == corpus.sha256:
                return manifest.parent
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("ignoring unreadable shipped-embeddings manifest %s: %s", manifest, e)
    return None


def _read_parts(folder: Path, manifest: dict[str, Any]) -> np.ndarray:
    parts = []
    for part in manifest["parts"]:
        f = folder / part["file"]
        if not f.is_file():
            raise EmbeddingsMismatch(f"{f} is missing")
        if file_sha256(f) != part["sha256"]:
            raise EmbeddingsMismatch(f"{f} has a different sha256 than MANIFEST.json records")
        parts.append(np.load(f, allow_pickle=False))
    half = np.concatenate(parts) if parts else np.zeros((0, 0), np.float16)
    if half.dtype != np.float16 or half.shape != (manifest["rows"], manifest["dim"]):
        raise EmbeddingsMismatch(
            f"{folder}: parts hold {half.dtype} {half.shape}, the manifest says float16 "
            f"({manifest['rows']}, {manifest['dim']})"
        )
    return half


def load_set(folder: Path, corpus: Corpus, settings: Settings, encoder: Encoder) -> np.ndarray:
    """The set's embeddings as float32 unit rows, after checking they belong to ``corpus`` and ``encoder``.

    Raises:
        EmbeddingsMismatch: what does not match (corpus, encoder, prefix, part hashes, shape, spot check).
    """
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    if manifest.get("format_version") != FORMAT_VERSION:
        raise EmbeddingsMismatch(f"format version {manifest.get('format_version')}, this code reads {FORMAT_VERSION}")
    if manifest["corpus"]["sha256"] != corpus.sha256 or manifest["rows"] != len(corpus):
        raise EmbeddingsMismatch(f"made for another corpus (sha256 {manifest['corpus']['sha256'][:12]}...)")
    expected = _encoder_entry(settings)
    for key in ("fingerprint", "passage_prefix"):
        if manifest["encoder"].get(key) != expected[key]:
            raise EmbeddingsMismatch(
                f"encoder {key} differs: shipped {manifest['encoder'].get(key)!r}, configured {expected[key]!r} "
                f"({settings.encoder_model})"
            )
    half = _read_parts(folder, manifest)
    if half.shape[1] != encoder.dim:
        raise EmbeddingsMismatch(f"shipped vectors have {half.shape[1]} dims, the encoder gives {encoder.dim}")
    embeddings = half.astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)  # undo float16's rounding of the length
    rows = np.unique(np.linspace(0, len(corpus) - 1, SPOT_CHECK_ROWS).round().astype(int))
    fresh = encoder.encode_passages([corpus.contents[i] for i in rows], batch_size=len(rows))
    cosine = float((fresh * embeddings[rows]).sum(axis=1).min())
    if cosine < MIN_SPOT_COSINE:
        raise EmbeddingsMismatch(f"re-encoded passages differ from the shipped vectors (cosine {cosine:.4f})")
    return embeddings


def shipped_embeddings(
    corpus: Corpus, settings: Settings, encoder: Encoder, root: Path = SHIPPED_EMBEDDINGS_DIR
) -> tuple[np.ndarray, Path] | None:
    """The verified shipped embeddings of ``corpus`` and their folder, or None (with the reason logged)."""
    folder = find_set(corpus, root)
    if folder is None:
        return None
    try:
        embeddings = load_set(folder, corpus, settings, encoder)
    except (EmbeddingsMismatch, OSError, ValueError, KeyError) as e:
        logger.warning("not using the shipped embeddings in %s (%s); encoding the corpus instead", folder, e)
        return None
    logger.info("using the shipped embeddings in %s (corpus, encoder and part hashes verified)", folder)
    return embeddings, folder
