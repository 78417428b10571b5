"""``main_eval`` with ``retriever.recording.mode=record`` against a real BM25 retriever, then again with
``retriever.backend=replay`` after that retriever has stopped: the same trajectories token for token and the same
metrics; the rollout records point to the recording's entries, and the run's manifest names the backend. The tiny
random model's first turn is pushed to ``<search> <its question> </search>`` (greedy, it would only write newlines);
the rest is its own greedy decoding.

Run: python -m pytest tests/search_rl/rollout/test_replay_eval.py -q
"""

from __future__ import annotations

import json
import re

import pytest

import search_rl.evaluation.run as eval_run
from retriever_server.launcher import RetrieverProcess, bm25_env
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.rollout.backends import RecordingStore
from search_rl.tools.rollout_viewer import load_records, render_record
from search_rl.tracking.jsonl import read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

SMALL = [
    "model=tiny",
    "data.max_samples=4",
    "max_turns=2",
    "actor_rollout_ref.rollout.max_turn_tokens=48",
    "batch_size=4",
]


class SearchTheQuestion:
    """Logits processor: the first turn of a sample is ``<search> <the prompt's question> </search>``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.scripts = tokenizer, {}

    def __call__(self, prompts, generated, logits):
        logits = logits.clone()
        for row, (prompt, gen) in enumerate(zip(prompts, generated, strict=True)):
            text = self.tokenizer.decode(list(prompt)[-400:], skip_special_tokens=True)
            if "<information>" in text.split("Question: ")[-1]:  # the instructions name the tag too
                continue
            key = tuple(prompt[-50:])
            if key not in self.scripts:
                found = re.findall(r"Question: ([^\n]+)", text)
                if not found:  # the question is outside the decoded tail: never a first turn
                    continue
                question = found[-1].strip()
                self.scripts[key] = self.tokenizer.encode(f"<search> {question} </search>", add_special_tokens=False)
            script = self.scripts[key]
            if len(gen) < len(script):
                logits[row, script[len(gen)]] += 100.0
        return logits


@pytest.fixture
def searching_engine(monkeypatch):
    build = eval_run.build_standalone_rollout

    def rollout(engine_cfg, loop, tokenizer, model, **kwargs):
        built = build(engine_cfg, loop, tokenizer, model, **kwargs)
        built.engine.logits_processor = SearchTheQuestion(tokenizer)
        return built

    monkeypatch.setattr(eval_run, "build_standalone_rollout", rollout)


def test_replay_reproduces_a_recorded_evaluation_with_the_retriever_stopped(searching_engine, tmp_path):
    rec = tmp_path / "retrievals.sqlite"
    with RetrieverProcess(env=bm25_env(tmp_path / "index", SHIPPED_CORPUS), ready_timeout_s=120) as server:
        cfg = load_eval_config(
            [*SMALL, f"retriever.url={server.url}", "retriever.recording.mode=record",
             f"retriever.recording.path={rec}", f"output_dir={tmp_path / 'recorded'}"]
        )  # fmt: skip
        recorded = evaluate(cfg)
    # the server is gone: a live search now fails, only the recording can answer
    cfg = load_eval_config(
        [*SMALL, "retriever.url=http://127.0.0.1:9", "retriever.backend=replay", f"retriever.recording.path={rec}",
         f"output_dir={tmp_path / 'replayed'}"]
    )  # fmt: skip
    replayed = evaluate(cfg)

    a = read_jsonl(recorded.output_dir / "trajectories.jsonl")
    b = read_jsonl(replayed.output_dir / "trajectories.jsonl")
    searches = sum(r["stats"]["searches"] for r in a)
    assert searches > 0, "the tiny model must search for this test to mean anything"
    for x, y in zip(a, b, strict=True):
        assert (x["prompt"], x["response"], x["segments"], x["search_calls"]) == (
            y["prompt"], y["response"], y["segments"], y["search_calls"],
        )  # fmt: skip
    same = {k: v for k, v in recorded.metrics.items() if "search_calls" not in k and "replayed" not in k}
    assert same == {k: replayed.metrics[k] for k in same}
    assert recorded.summary == replayed.summary
    assert recorded.metrics["eval/all/search_calls"] == searches and recorded.metrics["eval/all/searches_replayed"] == 0
    assert replayed.metrics["eval/all/search_calls"] == 0 and replayed.metrics["eval/all/searches_replayed"] == searches

    # every search of a record points to its entry in the recording, and the viewer shows the stored passages
    store = RecordingStore(rec, read_only=True)
    keys = [c["retrieval_key"] for r in a for c in r["search_calls"]]
    entries = store.get_many(keys)
    assert all(k in entries for k in keys)
    searched = next(r for r in load_records(recorded.output_dir) if r["search_calls"])
    call = searched["search_calls"][0]
    assert entries[call["retrieval_key"]].query.strip() == call["query"].strip()
    text = render_record(searched, store).plain
    assert f"entry {call['retrieval_key']}" in text and entries[call["retrieval_key"]].passages[0].text[:40] in text

    manifests = [json.loads((r.output_dir / "retrieval.json").read_text()) for r in (recorded, replayed)]
    assert manifests[0]["fingerprint"] == manifests[1]["fingerprint"]
    assert manifests[0]["fingerprint"]["backend"] == "http" and manifests[0]["fingerprint"]["method"] == "bm25"
    assert manifests[1]["backend"] == "replay" and manifests[1]["recording"]["mode"] == "replay"
