"""The loop without Ray: ``TrainingLoop`` (``PPOStep``), in-process workers, search off, tiny model.

Every advantage estimator and every preset (``dapo``, ``dr_grpo``, ``gspo``) runs one step through the real phases
(ReMax with its greedy baseline rollout, the critic only for GAE), and the loop's bookkeeping holds: the weight
version, validation and checkpoint schedule. Critic warm-up leaves the policy alone; dynamic sampling fills the batch
from further generation batches and trains on what it kept when the cap is hit.

Run: python -m pytest tests/search_rl/trainer/test_trainer_local.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from numerics import reorder_tol

from search_rl.configure import load_config
from search_rl.datatypes import GroundTruth, RewardResult, Trajectory
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.reward import REWARDS
from search_rl.trainer.dynamic_sampling import groups_with_spread
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker

pytestmark = pytest.mark.slow  # whole training steps of the tiny model, 4-9 s each

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
    assert actor.broadcast(ActorRolloutRefWorker.sync_weights, 5) == [(5, [])]


def _one_step(tmp_path, overrides: list[str]) -> dict[str, float]:
    cfg = load_config(
        [*BASE, "algorithm=grpo", "trainer.test_freq=0", f"trainer.default_local_dir={tmp_path}", *overrides]
    )
    actor, critic = build_workers(cfg, "cpu", local=True)
    return dict(build_trainer(cfg, prepare(cfg), actor, critic).fit())[1]


def _same_metric(a: dict[str, float], b: dict[str, float], key: str) -> bool:
    """Whether two runs' ``key`` agree up to their passes summing the same terms in other orders: a mean over the
    batch's tokens (at most ``perf/total_tokens`` terms of size ~1: ratios ~1, entropies ~log V / 100 after the
    coefficient) off by ``reorder_tol`` relatively, plus what the old log-probs' own reordering (each attends over at
    most as many tokens, |log p| < 2 log V) moves the policy-gradient term, ``max|A| * gap``, 0 when every advantage
    is 0 (tests/numerics.py)."""
    tol = reorder_tol(int(max(a["perf/total_tokens"], b["perf/total_tokens"])))
    adv = max(abs(m[k]) for m in (a, b) for k in ("critic/advantages_max", "critic/advantages_min"))
    old_gap = tol * 2 * math.log(49_152)  # SmolLM2's vocabulary
    return a[key] == pytest.approx(b[key], rel=tol, abs=tol + adv * old_gap)


def test_skipped_old_logprob_pass_trains_exactly_as_the_recomputed_one(tmp_path):
    # one mini-batch (ppo_mini_batch_size = train_batch_size = 2), one epoch: `auto` runs no old log-prob pass
    skipped = _one_step(tmp_path / "auto", [])
    recomputed = _one_step(tmp_path / "recompute", ["actor_rollout_ref.actor.old_logprobs=recompute"])
    assert skipped["actor/old_logprobs_recomputed"] == 0 and recomputed["actor/old_logprobs_recomputed"] == 1
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
        assert _same_metric(skipped, recomputed, key), (key, skipped[key], recomputed[key])
    # two mini-batches: the engine's log-probs (HF, float32) stand in for the recomputed ones. The second mini-batch
    # runs after an AdamW step, whose normalisation can turn a last-bit gradient difference into a move of up to
    # 2 lr; at lr 1e-12 no weight above 2e-5 in size can move at all (the step is below half its float32 spacing),
    # so both runs' second mini-batch sees the same weights and only the old log-probs' source differs.
    two = ["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.optim.lr=1e-12"]
    engine = _one_step(tmp_path / "engine", two)
    again = _one_step(tmp_path / "again", [*two, "actor_rollout_ref.actor.old_logprobs=recompute"])
    assert engine["actor/old_logprobs_recomputed"] == 0
    for key in ("actor/loss", "actor/grad_norm"):
        assert _same_metric(engine, again, key), (key, engine[key], again[key])
    # the update computing them (its first mini-batch from its own pass, the second from a pass before the first
    # step): the recomputed values, and the recompute pass's metrics logged
    update = _one_step(tmp_path / "update", [*two, "actor_rollout_ref.actor.old_logprobs=update"])
    assert update["actor/old_logprobs_recomputed"] == 1
    for key in ("actor/loss", "actor/grad_norm", "actor/entropy_rollout", "rollout/logprob_abs_diff"):
        assert _same_metric(update, again, key), (key, update[key], again[key])


def _run(overrides: list[str], tmp_path):
    cfg = load_config([*BASE, *overrides, "trainer.test_freq=0", f"trainer.default_local_dir={tmp_path}"])
    prepared = prepare(cfg)
    actor, critic = build_workers(cfg, "cpu", local=True)
    return build_trainer(cfg, prepared, actor, critic), actor, critic


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        # the budget is 64 tokens here: DAPO's buffer must be below it
        ("dapo", ["reward.overlong_buffer_tokens=16", "algorithm.filter_groups.max_num_gen_batches=2"]),
        ("dr_grpo", []),
        ("gspo", []),
    ],
)
def test_one_step_per_preset(preset, extra, tmp_path):
    trainer, _, critic = _run([f"algorithm={preset}", *extra], tmp_path)
    assert critic is None
    m = dict(trainer.fit())[1]
    assert math.isfinite(m["actor/loss"]) and m["actor/skipped_steps"] == 0
    if preset == "gspo":
        assert 0 <= m["actor/seq_clipfrac"] <= 1 and m["actor/seq_ratio_mean"] > 0
    if preset == "dapo":
        # A random model never writes <answer>: every group is flat on EM, so both generation batches are spent and
        # the step trains on nothing kept; one flat group pads the batch and stays out of the loss.
        assert m["dynamic_sampling/gen_batches"] == 2 and m["dynamic_sampling/cap_hit"] == 1
        assert (m["dynamic_sampling/dropped_groups"], m["dynamic_sampling/trained_groups"]) == (4, 0)
        assert m["dynamic_sampling/padding_groups"] == 1
        assert m["actor/pg_loss"] == 0.0 and m["reward/overlong_penalty"] <= 0


def _weights(group) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in group.worker.module.state_dict().items():
        full = getattr(value, "full_tensor", None)
        out[name] = (full() if callable(full) else value).detach().clone()
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_critic_warmup_moves_only_the_critic(tmp_path):
    overrides = ["algorithm=ppo", "trainer.critic_warmup=1", "trainer.total_training_steps=2"]
    trainer, actor, critic = _run(overrides, tmp_path)
    actor0, critic0 = _weights(actor), _weights(critic)
    m1 = trainer.step_fn.run(1)
    actor1, critic1 = _weights(actor), _weights(critic)
    assert _same(actor0, actor1), "the policy must not move during the critic's warm-up"
    assert not _same(critic0, critic1), "the critic trains during its warm-up"
    assert m1["critic/warmup"] == 1.0 and "critic/vf_loss" in m1 and "actor/pg_loss" not in m1
    m2 = trainer.step_fn.run(2)
    assert m2["rollout/weight_version"] == 0  # the engine still sampled with the initial weights
    assert "critic/warmup" not in m2 and "actor/pg_loss" in m2
    assert not _same(actor1, _weights(actor)) and not _same(critic1, _weights(critic))


_CALLS = [0]


def _flat_then_every_other_group(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """A scripted reward, in scoring order (2 prompts x 4 samples per generation batch): the first batch is flat,
    then every other group has a spread (0, 1, 0, 1) and the rest are flat."""
    k = _CALLS[0]
    _CALLS[0] += 1
    spread = k >= 8 and (k - 8) // 4 % 2 == 0
    return RewardResult(float(k % 2) if spread else 0.0, {"em": 0.0})


REWARDS.register("test_flat_then_every_other_group")(_flat_then_every_other_group)


def test_dynamic_sampling_fills_the_batch_from_further_prompts(tmp_path):
    trainer, _, _ = _run(
        [
            "algorithm=grpo",
            "algorithm.filter_groups.enable=true",
            "+reward.by_data_source.nq=test_flat_then_every_other_group",
            "+reward.by_data_source.hotpotqa=test_flat_then_every_other_group",
        ],
        tmp_path,
    )
    _CALLS[0] = 0
    step, m = trainer.step_fn, {}
    step.step = 1
    collected = step.collector.collect(1, m)
    # batch 1: both groups flat; batch 2: one kept; batch 3: one kept -> the batch is full after 3 of 10
    assert m["dynamic_sampling/gen_batches"] == 3 and m["dynamic_sampling/cap_hit"] == 0
    assert (m["dynamic_sampling/kept_groups"], m["dynamic_sampling/dropped_groups"]) == (2, 4)
    assert len(collected.trajectories) == 8 and len(set(collected.prompts.uids)) == 2
    scores = [r.score for r in collected.results]
    assert all(groups_with_spread(scores, collected.prompts.uids))
    assert collected.batch.sample_mask is None or bool(collected.batch.sample_mask.all())
    batch = step.learn(collected, m)
    assert math.isfinite(m["actor/loss"]) and m["critic/advantages_max"] > 0
    assert batch.input_ids.shape[0] == 8
