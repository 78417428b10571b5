"""Search backends behind the agent loop's ``Retriever`` protocol, built from ``retriever.*`` in one place.

``build_retriever(cfg)`` is the one factory (actor workers, generators, ``main_eval``, the entry points' start-up
checks): ``http`` (the retriever service, ``HttpBackend``), ``web`` (``WebBackend``: Serper or Brave), ``simulated``
(``SimulatedBackend``: a language model writes the documents) or ``replay`` (only a recording), each wrapped in a
``RecordingRetriever`` when ``retriever.recording.mode`` is not ``off``. Every backend returns ``Passage`` lists,
says which search engine it is (``fingerprint()``), checks itself before a run (``check_reachable()``) and counts
its calls and cost (``meter``).

The room holds everything a search call crosses below the agent loop: ``retriever_client`` (the HTTP client of the
Search-R1 ``/retrieve`` contract), ``recording_store`` (the SQLite store of every retrieval and opened document),
``recording`` (the retriever that writes and replays it), ``identity`` (``BackendIdentity``, a backend's
fingerprint), ``meter`` and the backends themselves. It imports nothing of
``search_rl.rollout`` outside this folder; code outside imports the names below, not the modules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from search_rl.config import ConfigError, RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter, meter_metrics, meter_of
from search_rl.rollout.backends.recording import RecordingMiss, RecordingRetriever
from search_rl.rollout.backends.recording_store import DocumentEntry, Entry, RecordingStore
from search_rl.rollout.backends.retriever_client import RetrieverClient, RetrieverError


class SearchBackend(Protocol):
    """What every built backend provides (the ``Retriever`` protocol plus identity, check and meter)."""

    @property
    def meter(self) -> CostMeter: ...

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...

    def fingerprint(self) -> BackendIdentity: ...

    def check_reachable(self) -> None: ...


def build_live_backend(cfg: RetrieverClientConfig) -> SearchBackend:
    """The live backend of ``retriever.backend`` (not ``replay``)."""
    if cfg.backend == "http":
        from search_rl.rollout.backends.http import HttpBackend

        return HttpBackend(cfg)
    if cfg.backend == "web":
        from search_rl.rollout.backends.web import WebBackend

        return WebBackend(cfg.web, cfg.topk)
    if cfg.backend == "simulated":
        from search_rl.rollout.backends.simulated import SimulatedBackend

        return SimulatedBackend(cfg.simulated, cfg.topk)
    raise ValueError(f"retriever.backend={cfg.backend!r} has no live backend (one of http, web, simulated)")


def recorded_fingerprint(store: RecordingStore, wanted: str | None) -> BackendIdentity:
    """The fingerprint a replay-only run answers as: ``wanted`` (an id), or the only one in the recording.

    Raises:
        ConfigError: the id is not in the file, or the file holds several and none was chosen.
    """
    known = {fid: desc for fid, desc, _ in store.fingerprints()}
    if wanted is not None:
        if wanted not in known:
            raise ConfigError(
                f"retriever.recording.fingerprint={wanted} is not in {store.path}; it holds {sorted(known) or 'none'}"
            )
        return BackendIdentity.parse(known[wanted])
    if len(known) != 1:
        listing = "; ".join(f"{fid} {desc}" for fid, desc in known.items()) or "no recorded backend"
        raise ConfigError(
            f"retriever.backend=replay: {store.path} holds {len(known)} recorded backends ({listing}); choose one "
            "with retriever.recording.fingerprint=<id>"
        )
    return BackendIdentity.parse(next(iter(known.values())))


def build_retriever(cfg: RetrieverClientConfig) -> SearchBackend:
    """The search backend of ``retriever.*`` (module docstring).

    Raises:
        FileNotFoundError: ``replay`` and no recording at ``retriever.recording.path``.
        ConfigError: a web backend without its API key; an ambiguous replay fingerprint.
        RetrieverError: ``record``/``cache``/``replay`` over ``http`` and the retriever's ``/health`` cannot be read.
    """
    rec = cfg.recording
    mode = "replay" if cfg.backend == "replay" else rec.mode
    live = None if cfg.backend == "replay" else build_live_backend(cfg)
    if mode == "off":
        assert live is not None  # backend=replay always has a recording mode
        return live
    assert rec.path is not None  # RecordingConfig checks it
    if mode == "replay" and not Path(rec.path).is_file():
        raise FileNotFoundError(f"retriever.recording.path={rec.path}: no recording there to replay")
    store = RecordingStore(rec.path)
    fp = live.fingerprint() if live is not None else recorded_fingerprint(store, rec.fingerprint)
    return RecordingRetriever(store, mode, fp, cfg.topk, live, rec.on_miss)


def backend_manifest(cfg: RetrieverClientConfig, retriever: Any) -> dict[str, Any]:
    """What a run records about its search backend: the backend, its fingerprint and the recording."""
    fp: BackendIdentity | None = retriever.fingerprint() if hasattr(retriever, "fingerprint") else None
    rec = cfg.recording
    mode = "replay" if cfg.backend == "replay" else rec.mode
    return {
        "backend": cfg.backend,
        "topk": cfg.topk,
        "fingerprint": fp.as_dict() if fp is not None else None,
        "recording": {"mode": mode, "path": rec.path if mode != "off" else None},
    }


def write_backend_manifest(path: Path, cfg: RetrieverClientConfig, retriever: Any) -> dict[str, Any]:
    """Write ``backend_manifest`` as JSON to ``path`` (``retrieval.json`` of a run) and return it."""
    manifest = backend_manifest(cfg, retriever)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


__all__ = [
    "BackendIdentity",
    "CostMeter",
    "DocumentEntry",
    "Entry",
    "RecordingMiss",
    "RecordingRetriever",
    "RecordingStore",
    "RetrieverClient",
    "RetrieverError",
    "SearchBackend",
    "backend_manifest",
    "build_live_backend",
    "build_retriever",
    "meter_metrics",
    "meter_of",
    "recorded_fingerprint",
    "write_backend_manifest",
]
