"""``retriever.backend=simulated``: a language model writes the documents for a query (ZeroSearch, Sun et al. 2025,
https://arxiv.org/abs/2505.04588), a cost-free stand-in for a web search API at RL volume.

The writer is a local model (``retriever.simulated.model``, run with the HF engine, all queries of a turn in one
batch) or an OpenAI-compatible server (``retriever.simulated.endpoint``, ``POST /chat/completions``). One prompt per
query asks for ``k`` documents in a fixed layout; the answer is split on the ``Doc i (Title: ...)`` markers, and a
writer that ignores them (a small or random model) has its text cut into ``k`` equal pieces (empty ones dropped). A
greedy small model tends to write nothing but newlines: give it a temperature (sampling is seeded). Known bias: the
documents are what the writer believes, so they repeat its errors and hallucinations, never hold a fact it does not
know, and tend to mirror the wording of the query (an easier search than a real corpus); ZeroSearch fine-tunes the
writer and mixes in noisy documents to counter this. Use it to exercise a pipeline or to pre-train search
behaviour, not to measure a policy's accuracy.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Sequence
from typing import Any

import httpx

from search_rl.config.search_backends import SimulatedSearchConfig
from search_rl.datatypes import Passage, SamplingParams
from search_rl.models.identity import source_weights_sha256
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.meter import CostMeter
from search_rl.rollout.backends.retriever_client import RetrieverError, describe_failure

PROMPT = (
    "You are a search engine over Wikipedia. Write {k} short documents that answer or relate to the search query, "
    "each one to three factual sentences, in exactly this layout:\n"
    "Doc 1 (Title: <title>) <text>\nDoc 2 (Title: <title>) <text>\n\nSearch query: {query}"
)
"""The writer's prompt (its hash is part of the fingerprint)."""
_DOC = re.compile(r"Doc\s*\d+\s*\(Title:\s*(?P<title>[^)]*)\)\s*:?\s*(?P<text>.*?)(?=Doc\s*\d+\s*\(Title:|\Z)", re.S)


def split_documents(text: str, k: int, query: str) -> list[Passage]:
    """``k`` passages from the writer's answer: by its ``Doc i (Title: t)`` markers, else ``k`` equal pieces.

    >>> [p.title for p in split_documents("Doc 1 (Title: A) one. Doc 2 (Title: B) two.", 2, "q")]
    ['A', 'B']
    >>> [p.text for p in split_documents("w1 w2 w3 w4", 2, "q")]
    ['w1 w2', 'w3 w4']
    """
    docs = [(m["title"].strip(), " ".join(m["text"].split())) for m in _DOC.finditer(text)]
    if not docs:
        words = text.split()
        size = max(1, -(-len(words) // k))
        docs = [("", " ".join(words[i : i + size])) for i in range(0, max(len(words), 1), size)]
    digest = hashlib.sha256(query.encode()).hexdigest()[:8]
    docs = [(t, x) for t, x in docs if x][:k]  # a writer that wrote nothing found nothing
    return [Passage(id=f"sim-{digest}-{i}", title=t, text=x) for i, (t, x) in enumerate(docs)]


class SimulatedBackend:
    """Search simulated by a language model (module docstring)."""

    def __init__(self, cfg: SimulatedSearchConfig, default_topk: int) -> None:
        self.cfg, self.default_topk = cfg, default_topk
        self.meter = CostMeter()
        self._engine: Any = None
        self._tokenizer: Any = None

    def fingerprint(self) -> BackendIdentity:
        """The writer (an endpoint and its model name, or the sha256 of the local model's weights: the same weights
        at another path are the same writer), the prompt and the decoding settings.

        Raises:
            FileNotFoundError: the local writer model does not exist.
        """
        c = self.cfg
        if c.endpoint:
            writer = {"endpoint": c.endpoint, "endpoint_model": c.endpoint_model}
        else:
            writer = {"model_sha256": source_weights_sha256(c.model, seed=c.seed)}
        prompt = hashlib.sha256(PROMPT.encode()).hexdigest()[:12]
        return BackendIdentity.of(
            "simulated",
            **writer,
            prompt=prompt,
            max_doc_tokens=c.max_doc_tokens,
            temperature=c.temperature,
            seed=c.seed,
        )

    def check_reachable(self) -> None:
        """Load the local writer, or ask the endpoint for one document."""
        asyncio.run(self.search(["search engine"], 1))

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """``topk`` written documents per query.

        Raises:
            RetrieverError: the endpoint failed or answered something else than a chat completion.
        """
        k = topk or self.default_topk
        if not queries:
            return []
        prompts = [PROMPT.format(k=k, query=q) for q in queries]
        if self.cfg.endpoint:
            texts = await asyncio.gather(*(self._ask_endpoint(p, k) for p in prompts))
        else:
            texts = await asyncio.to_thread(self._write_locally, prompts, k)
        self.meter.calls += len(queries)
        return [split_documents(t, k, q) for t, q in zip(texts, queries, strict=True)]

    def _write_locally(self, prompts: list[str], k: int) -> list[str]:
        import torch

        from search_rl.config import EngineRolloutConfig
        from search_rl.models import load_model, load_tokenizer
        from search_rl.prompt_data import encode_prompt
        from search_rl.rollout.engines.factory import build_engine

        if self._engine is None:
            self._tokenizer = load_tokenizer(self.cfg.model)
            model = load_model(self.cfg.model, seed=self.cfg.seed)  # on the CPU, where the writer generates
            writer = EngineRolloutConfig(engine="hf")  # the HF engine's default settings
            self._engine = build_engine(
                writer, self._tokenizer, model=model, export=None, device=torch.device("cpu"), seed=self.cfg.seed
            )
        greedy = self.cfg.temperature == 0
        params = SamplingParams(
            max_new_tokens=k * self.cfg.max_doc_tokens,
            temperature=self.cfg.temperature if not greedy else 1.0,
            greedy=greedy,
            seed=self.cfg.seed,
            logprobs=False,
        )
        ids = [encode_prompt(self._tokenizer, [{"role": "user", "content": p}]) for p in prompts]
        with torch.no_grad():
            gens = self._engine.generate(ids, params)
        return [str(self._tokenizer.decode(g.token_ids, skip_special_tokens=True)) for g in gens]

    async def _ask_endpoint(self, prompt: str, k: int) -> str:
        c = self.cfg
        url = f"{str(c.endpoint).rstrip('/')}/chat/completions"
        key = os.environ.get(c.api_key_env, "")
        body = {
            "model": c.endpoint_model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": k * c.max_doc_tokens,
            "temperature": c.temperature,
            "seed": c.seed,
        }
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with httpx.AsyncClient(timeout=c.timeout_s) as client:
                resp = await client.post(url, json=body, headers=headers)
        except httpx.TransportError as e:
            raise RetrieverError(f"simulated search: {url} not reachable ({describe_failure(e, c.timeout_s)})") from e
        text = resp.text[:200].replace(key, "***") if key else resp.text[:200]
        if resp.status_code != 200:
            raise RetrieverError(f"simulated search: {url} answered HTTP {resp.status_code}: {text}")
        try:
            return str(resp.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RetrieverError(f"simulated search: {url} sent no chat completion ({e!r}): {text}") from None
