"""``retriever.backend=simulated``: a language model writes the documents. An OpenAI-compatible endpoint (a local
server answering chat completions) and the local tiny random model as writers; a GRPO run whose search engine is the
tiny model, recorded, and the same run resumed from its step-1 checkpoint under ``retriever.backend=replay``, which
reproduces step 2's rollouts token for token.

Run: python -m pytest tests/search_rl/rollout/backends/test_simulated_search.py -q
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from search_rl.config.search_backends import SimulatedSearchConfig
from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.models.identity import source_weights_sha256
from search_rl.rollout.backends import RecordingStore, RetrieverError
from search_rl.rollout.backends.simulated import PROMPT, SimulatedBackend
from search_rl.tracking.jsonl import read_jsonl

COMPLETION = "Doc 1 (Title: Paris) Paris is the capital of France.\nDoc 2 (Title: France) France is in Europe."


@pytest.fixture
def chat_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1; a request asking for 1 document gets a 500."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
            fail = "Write 1 short" in body["messages"][0]["content"]
            answer = {"error": "overloaded"} if fail else {
                "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": COMPLETION}}],
            }  # fmt: skip
            data = json.dumps(answer).encode()
            self.send_response(500 if fail else 200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_an_openai_compatible_endpoint_writes_the_documents(chat_server, monkeypatch):
    url, seen = chat_server
    monkeypatch.setenv("SIM_KEY", "sim-secret-123")
    backend = SimulatedBackend(SimulatedSearchConfig(endpoint=url, endpoint_model="writer", api_key_env="SIM_KEY"), 2)
    [passages] = asyncio.run(backend.search(["capital of France"]))
    assert [(p.title, p.text) for p in passages] == [("Paris", "Paris is the capital of France."),
                                                     ("France", "France is in Europe.")]  # fmt: skip
    request = seen[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sim-secret-123"
    assert request["body"]["messages"][0]["content"] == PROMPT.format(k=2, query="capital of France")
    assert request["body"]["model"] == "writer" and request["body"]["max_tokens"] == 2 * 64
    with pytest.raises(RetrieverError, match="HTTP 500"):
        asyncio.run(backend.search(["anything"], 1))
    assert backend.meter.calls == 1 and backend.fingerprint().backend == "simulated"


def test_the_local_tiny_model_writes_k_documents_deterministically():
    cfg = SimulatedSearchConfig(model="tiny", max_doc_tokens=8, temperature=1.0)
    first = asyncio.run(SimulatedBackend(cfg, 3).search(["capital of France", "who wrote Hamlet"]))
    again = asyncio.run(SimulatedBackend(cfg, 3).search(["capital of France", "who wrote Hamlet"]))
    assert first == again and all(len(docs) == 3 for docs in first)  # the seeded writer, its text in 3 pieces
    assert all(len(p.text.split()) >= 3 for docs in first for p in docs)


def test_a_local_writer_is_named_by_its_weights_not_its_path(tmp_path):
    from search_rl.models import load_model

    model = load_model("tiny", seed=0)
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "copy of a")

    def identity(folder: Path) -> dict[str, str]:
        return SimulatedBackend(SimulatedSearchConfig(model=str(folder)), 3).fingerprint().as_dict()

    a = identity(tmp_path / "a")
    assert a == identity(tmp_path / "copy of a") and str(tmp_path) not in json.dumps(a)
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    model.save_pretrained(tmp_path / "b")
    assert identity(tmp_path / "b")["model_sha256"] != a["model_sha256"]


class SearchFirst:
    """Logits processor: the first turn of every sample is ``<search> QUERY </search>`` (the tiny random policy
    would rarely search); later turns are the policy's own samples."""

    BIAS = 100.0

    def __init__(self, tokenizer, query: str = "capital of France") -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode(f"<search> {query} </search>", add_special_tokens=False)

    def __call__(self, prompts, generated, logits):
        logits = logits.clone()
        for row, (prompt, gen) in enumerate(zip(prompts, generated, strict=True)):
            later_turn = "<information>" in self.tokenizer.decode(list(prompt)[-400:]).split("Question: ")[-1]
            if not later_turn and len(gen) < len(self.ids):
                logits[row, self.ids[len(gen)]] += self.BIAS
        return logits


def _train(run_dir: Path, tokenizer, *extra: str) -> dict[int, dict[str, float]]:
    cfg = load_config(
        [
            "model=tiny",
            "algorithm=grpo",
            "max_turns=1",
            "trainer.logger=[]",
            "trainer.torch_threads_per_worker=1",
            "trainer.total_training_steps=2",
            "trainer.save_freq=1",
            "trainer.test_freq=0",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.max_turn_tokens=16",
            "actor_rollout_ref.rollout.max_response_tokens=128",
            "actor_rollout_ref.rollout.max_obs_tokens=64",
            "retriever.topk=2",
            f"trainer.default_local_dir={run_dir}",
            *extra,
        ]
    )
    prepared = prepare(cfg)
    actor, critic = build_workers(cfg, "cpu", local=True)
    actor.worker.engine.logits_processor = SearchFirst(tokenizer)
    return dict(build_trainer(cfg, prepared, actor, critic).fit())


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grpo_with_simulated_search_then_resumed_under_replay_reproduces_the_rollouts(tokenizer, tmp_path):
    rec = tmp_path / "retrievals.sqlite"
    simulated = [
        "retriever.backend=simulated",
        "retriever.simulated.model=tiny",
        "retriever.simulated.temperature=1",
        "retriever.simulated.max_doc_tokens=8",
    ]
    recorded = _train(tmp_path / "a", tokenizer, *simulated, "retriever.recording.mode=record",
                      f"retriever.recording.path={rec}")  # fmt: skip
    for m in recorded.values():
        # the 4 samples of a step search the same query: the writer is asked once
        assert math.isfinite(m["actor/loss"]) and m["rollout/search_calls"] == 1 and m["rollout/search_cost_usd"] == 0
    manifest = json.loads((tmp_path / "a" / "retrieval.json").read_text())
    tiny_sha256 = source_weights_sha256("tiny", seed=SimulatedSearchConfig().seed)
    assert manifest["backend"] == "simulated" and manifest["fingerprint"]["model_sha256"] == tiny_sha256
    [(fingerprint, _, entries)] = RecordingStore(rec).fingerprints()
    assert fingerprint == manifest["fingerprint"]["id"] and entries >= 1

    # resumed from step 1 with no writer at all: only the recording answers
    resumed = _train(tmp_path / "b", tokenizer, "retriever.backend=replay", f"retriever.recording.path={rec}",
                     f"trainer.resume={tmp_path / 'a' / 'global_step_1'}")  # fmt: skip
    assert sorted(resumed) == [2] and resumed[2]["rollout/searches_replayed"] == 4
    assert resumed[2]["rollout/search_calls"] == 0
    a = read_jsonl(tmp_path / "a" / "rollouts" / "train_step_000002.jsonl")
    b = read_jsonl(tmp_path / "b" / "rollouts" / "train_step_000002.jsonl")
    assert [(r["response"], r["segments"], r["search_calls"]) for r in a] == [
        (r["response"], r["segments"], r["search_calls"]) for r in b
    ]
    assert all(c["retrieval_key"] for r in a for c in r["search_calls"])
