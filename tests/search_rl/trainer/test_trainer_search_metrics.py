"""The trainer logs the search diagnostics per step (``rollout/*``) and per validation (``val/<source>/*``).

One GRPO step of the tiny model with search on, in-process workers (no Ray), against a real retriever.

Run: python -m pytest tests/search_rl/trainer/test_trainer_search_metrics.py -q
"""

from __future__ import annotations

import json

import pytest

from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare

pytestmark = pytest.mark.integration

BUCKETS = ("0", "1", "2", "3plus")


def test_step_and_validation_carry_the_search_diagnostics(retriever_url, tmp_path):
    cfg = load_config(
        [
            "model=tiny",
            "algorithm=grpo",
            f"retriever.url={retriever_url}",
            "max_turns=1",
            "trainer.logger=[]",
            "trainer.torch_threads_per_worker=1",
            "trainer.total_training_steps=1",
            "trainer.test_freq=1",
            "trainer.save_freq=0",
            "data.train_batch_size=2",
            "data.val_max_samples=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.max_turn_tokens=12",
            "actor_rollout_ref.rollout.max_response_tokens=96",
            "actor_rollout_ref.rollout.max_obs_tokens=48",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    actor, critic = build_workers(cfg, "cpu", local=True)
    m = dict(build_trainer(cfg, prepare(cfg), actor, critic).fit())[1]
    for key in ("search_attempts", "valid_search_rate", "duplicate_query_rate", "gold_retrieved", "answer_words_mean"):
        assert f"rollout/{key}" in m and f"val/all/{key}" in m
    assert sum(m[f"rollout/n_searches_{b}"] for b in BUCKETS) == 4  # 2 prompts x 2 samples
    assert sum(m[f"val/all/n_searches_{b}"] for b in BUCKETS) == m["val/all/n"] == 2
    shares = sum(m[f"rollout/{k}"] for k in ("no_answer", "wrong_no_search", "retrieval_missed", "read_wrong"))
    assert shares + m["reward/em"] == pytest.approx(1.0)

    # the step's rollout dump holds what the rates were computed from
    (dump,) = tmp_path.rglob("rollouts/train_step_000001.jsonl")
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    attempts = sum(r["stats"]["search_attempts"] for r in records)
    searches = sum(len(r["search_calls"]) for r in records)
    assert searches == sum(r["stats"]["searches"] for r in records)
    assert m["rollout/valid_search_rate"] == pytest.approx(searches / attempts if attempts else 0.0)
    assert m["rollout/no_answer"] == pytest.approx(sum(r["outcome"] == "no_answer" for r in records) / 4)
