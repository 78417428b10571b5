"""``retriever.backend=http``: the retriever service (Search-R1's ``POST /retrieve`` contract), unchanged
``RetrieverClient`` plus what identifies its index (from ``GET /health``) and a cost meter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.backends.retriever_client import RetrieverClient, RetrieverError, describe_failure, start_hint

IDENTITY_FIELDS = (
    "method",
    "num_documents",
    "index_path",
    "encoder_model",
    "corpus_sha256",
    "index_key",
    "search_settings",
)
"""``/health`` fields that identify the answers (status and progress do not): the corpus, the index (``index_key``
changes with its content and build settings) and the query-time settings (``search_settings``: nprobe, efSearch,
query prefix, hybrid weights, encoder backend...); absent or null ones are skipped."""


def identity_facts(health: Mapping[str, Any]) -> dict[str, Any]:
    """The ``IDENTITY_FIELDS`` of a ``/health`` body, a nested dict as dotted keys (so a difference names the
    setting: ``search_settings.nprobe``); nulls left out.

    >>> identity_facts({"method": "dense", "status": "ok", "search_settings": {"nprobe": 16, "ef_search": None}})
    {'method': 'dense', 'search_settings.nprobe': 16}
    """
    return _dotted({k: health.get(k) for k in IDENTITY_FIELDS})


def _dotted(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(_dotted(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out


class HttpBackend(RetrieverClient):
    """The HTTP retriever client with ``fingerprint()`` and ``meter`` (see ``RetrieverClient``)."""

    def __init__(self, cfg: RetrieverClientConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(cfg, transport)
        self.meter = CostMeter()
        self._fingerprint: BackendIdentity | None = None

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        results = await super().search(queries, topk)
        self.meter.calls += len(queries)
        return results

    def fingerprint(self) -> BackendIdentity:
        """The index behind the first URL, from ``GET /health`` (replicas serve the same index).

        Raises:
            RetrieverError: the retriever is not reachable or not ready.
        """
        if self._fingerprint is None:
            url = self.urls[0]
            try:
                with httpx.Client(timeout=self.cfg.timeout_s, trust_env=self.cfg.trust_env) as client:
                    resp = client.get(f"{url}/health")
            except httpx.TransportError as e:
                detail = describe_failure(e, self.cfg.timeout_s)
                raise RetrieverError(f"retriever at {url} is not reachable ({detail}). {start_hint(url)}", url) from e
            if resp.status_code != 200:
                raise RetrieverError(
                    f"retriever at {url} cannot say which index it serves: GET /health answered "
                    f"{resp.status_code} {resp.text[:200]}",
                    url,
                )
            health = resp.json()
            self._fingerprint = BackendIdentity.of("http", **identity_facts(health))
        return self._fingerprint
