"""The learning-rate schedule: linear warm-up, then constant or a cosine decay to ``min_lr_ratio * lr``.

Checked against hand-computed values, through the optimizer a worker actually steps, and across a checkpoint taken
in the middle of the decay.

Run: python -m pytest tests/search_rl/workers/test_lr_schedule.py -q
"""

from __future__ import annotations

import math

import pytest
from torch import nn

from search_rl.config import ConfigError, OptimConfig
from search_rl.configure import load_config
from search_rl.workers.distributed import WorkerSpec
from search_rl.workers.optimization import TrainableModel

# warm-up 2, cosine over 4 steps to 0.1: factor = 0.1 + 0.9 * (1 + cos(pi * k / 4)) / 2 for k = 0..4, then 0.1
COSINE = [0.5, 1.0, 1.0, 0.1 + 0.45 * (1 + math.sqrt(0.5)), 0.55, 0.1 + 0.45 * (1 - math.sqrt(0.5)), 0.1, 0.1]


def test_cosine_decay_factors_match_hand_computed_values():
    optim = OptimConfig(lr=1e-4, lr_warmup_steps=2, lr_decay_steps=4, min_lr_ratio=0.1)
    assert [optim.lr_factor(s) for s in range(8)] == pytest.approx(COSINE)


def test_without_decay_steps_the_rate_stays_at_its_peak_after_the_warm_up():
    optim = OptimConfig(lr=1e-4, lr_warmup_steps=4)
    assert [optim.lr_factor(s) for s in range(7)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0])
    assert OptimConfig(lr=1e-4, lr_decay_steps=2).lr_factor(0) == 1.0  # no warm-up: decay starts at the peak


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"lr_decay_steps": -1}, "optim.lr_decay_steps must be >= 0, got -1"),
        ({"lr_warmup_steps": -2}, "optim.lr_warmup_steps must be >= 0, got -2"),
        ({"min_lr_ratio": 1.5}, "optim.min_lr_ratio must be in"),
    ],
)
def test_bad_schedule_fields_are_rejected_by_name(fields, named):
    with pytest.raises(ConfigError, match=named):
        OptimConfig(lr=1e-4, **fields)


def _trainable(optim: OptimConfig) -> TrainableModel:
    return TrainableModel(nn.Linear(2, 2), optim, 1.0, WorkerSpec(rank=0, world_size=1), "actor")


def _lrs(model: TrainableModel, steps: int) -> list[float]:
    """The learning rate each of ``steps`` optimizer steps runs at, stepping as ``ppo_update`` does."""
    out = []
    for _ in range(steps):
        out.append(model.optimizer.param_groups[0]["lr"])
        model.optimizer.step()
        model.scheduler.step()
    return out


def test_the_worker_optimizer_follows_the_schedule_and_resumes_mid_decay():
    optim = OptimConfig(lr=1e-3, lr_warmup_steps=2, lr_decay_steps=4, min_lr_ratio=0.1)
    model = _trainable(optim)
    first = _lrs(model, 4)
    assert first == pytest.approx([1e-3 * f for f in COSINE[:4]])
    resumed = _trainable(optim)
    resumed.load_optimizer_state(model.optimizer_state())  # what a checkpoint saves and a resume loads
    assert _lrs(resumed, 4) == pytest.approx([1e-3 * f for f in COSINE[4:]])


def test_hydra_overrides_reach_the_actor_optimizer():
    cfg = load_config(
        ["actor_rollout_ref.actor.optim.lr_decay_steps=48", "actor_rollout_ref.actor.optim.min_lr_ratio=0.1"]
    )
    optim = cfg.actor_rollout_ref.actor.optim
    assert (optim.lr_decay_steps, optim.min_lr_ratio) == (48, 0.1)
    assert optim.lr_factor(48) == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        load_config(["actor_rollout_ref.actor.optim.min_lr_ratio=2"])
