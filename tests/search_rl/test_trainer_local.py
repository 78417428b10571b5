"""The loop without Ray: ``PPOTrainer`` with in-process workers (``LocalWorkerGroup``), search off, tiny model.

Every advantage estimator runs one step through the real phases (ReMax with its greedy baseline rollout, the
critic only for GAE), and the loop's bookkeeping holds: the weight version, validation and checkpoint schedule.

Run: python -m pytest tests/search_rl/test_trainer_local.py -q
"""

from __future__ import annotations

import math

import pytest

from search_rl.config import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare

BASE = [
    "model=tiny",
    "do_search=false",
    "trainer.logger=[]",
    "trainer.torch_threads_per_worker=1",
    "trainer.total_training_steps=1",
    "trainer.test_freq=1",
    "trainer.save_freq=0",
    "data.train_batch_size=2",
    "data.val_max_samples=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.max_turn_tokens=12",
    "actor_rollout_ref.rollout.max_response_tokens=64",
    "actor_rollout_ref.rollout.max_obs_tokens=32",
    "algorithm.entropy_coeff=0.01",
]


@pytest.mark.parametrize(
    ("estimator", "extra"),
    [
        ("gae", ["algorithm=ppo"]),
        ("grpo", ["algorithm=grpo"]),
        ("rloo", ["algorithm=grpo", "algorithm.adv_estimator=rloo"]),
        ("reinforce_plus_plus", ["algorithm=grpo", "algorithm.adv_estimator=reinforce_plus_plus"]),
        ("remax", ["algorithm=grpo", "algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=1"]),
    ],
)
def test_one_step_per_estimator(estimator, extra, tmp_path):
    cfg = load_config([*BASE, *extra, f"trainer.default_local_dir={tmp_path}"])
    assert cfg.algorithm.adv_estimator == estimator
    prepared = prepare(cfg)
    actor, critic = build_workers(cfg, "cpu", local=True)
    assert (critic is not None) == (estimator == "gae")
    history = dict(build_trainer(cfg, prepared, actor, critic).fit())
    m = history[1]
    assert math.isfinite(m["actor/loss"]) and m["rollout/weight_version"] == 0
    assert m["rollout/searches_mean"] == 0 and m["rollout/turns_mean"] == 1  # search off: one answer turn
    assert "val/all/em" in m and ("critic/vf_loss" in m) == (estimator == "gae")
    assert actor.broadcast("sync_weights", 5) == [5]


def _one_step(tmp_path, overrides: list[str]) -> dict[str, float]:
    cfg = load_config(
        [*BASE, "algorithm=grpo", "trainer.test_freq=0", f"trainer.default_local_dir={tmp_path}", *overrides]
    )
    actor, critic = build_workers(cfg, "cpu", local=True)
    return dict(build_trainer(cfg, prepare(cfg), actor, critic).fit())[1]


def test_skipped_old_logprob_pass_trains_exactly_as_the_recomputed_one(tmp_path):
    # one mini-batch (ppo_mini_batch_size = train_batch_size = 2), one epoch: `auto` runs no old log-prob pass
    skipped = _one_step(tmp_path / "auto", [])
    recomputed = _one_step(tmp_path / "recompute", ["actor_rollout_ref.actor.old_logprobs=recompute"])
    assert skipped["actor/old_logprobs_recomputed"] == 0 and recomputed["actor/old_logprobs_recomputed"] == 1
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
        assert skipped[key] == pytest.approx(recomputed[key], rel=1e-4, abs=1e-6), key
    # two mini-batches: the engine's log-probs (HF, float32) stand in for the recomputed ones
    engine = _one_step(tmp_path / "engine", ["actor_rollout_ref.actor.ppo_mini_batch_size=1"])
    again = _one_step(
        tmp_path / "again",
        ["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.old_logprobs=recompute"],
    )
    assert engine["actor/old_logprobs_recomputed"] == 0
    for key in ("actor/loss", "actor/grad_norm"):
        assert engine[key] == pytest.approx(again[key], rel=1e-3, abs=1e-5), key
