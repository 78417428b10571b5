"""``retriever.backend=http``: the retriever service (Search-R1's ``POST /retrieve`` contract), unchanged
``RetrieverClient`` plus what identifies its index (from ``GET /health``) and a cost meter."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from search_rl.config import RetrieverClientConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.recording import BackendIdentity
from search_rl.rollout.retriever_client import RetrieverClient, RetrieverError, describe_failure, start_hint

IDENTITY_FIELDS = ("method", "num_documents", "index_path", "encoder_model", "corpus_sha256", "index_key")
"""``/health`` fields that identify the answers (status and progress do not); absent ones are skipped."""


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
            self._fingerprint = BackendIdentity.of("http", **{k: health.get(k) for k in IDENTITY_FIELDS})
        return self._fingerprint
