"""Early warnings in a real run (``TrainingLoop`` without Ray, tiny model, search off): a learning rate that
collapses the policy's entropy fires ``entropy_collapse`` and, with ``trainer.stop_on``, stops the run after saving a
checkpoint; the same run at a normal learning rate stays silent.

Run: python -m pytest tests/search_rl/trainer/test_health_stop.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from checksum_reward import CHECKSUM_REWARD  # noqa: E402  (registers the reward)

BASE = [
    "model=tiny",
    "do_search=false",
    "algorithm=grpo",
    f"reward.default={CHECKSUM_REWARD}",
    f"+reward.by_data_source.nq={CHECKSUM_REWARD}",
    f"+reward.by_data_source.hotpotqa={CHECKSUM_REWARD}",
    "trainer.logger=[]",
    "trainer.torch_threads_per_worker=1",
    "trainer.total_training_steps=COLLAPSE_STEPS",
    "trainer.test_freq=0",
    "trainer.save_freq=0",
    "trainer.resume=disable",
    "trainer.health.window_steps=1",
    "trainer.health.baseline_steps=1",
    "trainer.stop_on=[entropy_collapse]",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.max_turn_tokens=12",
    "actor_rollout_ref.rollout.max_response_tokens=64",
    "actor_rollout_ref.rollout.max_obs_tokens=32",
]
COLLAPSE_STEPS = 6
COLLAPSE_LR = 1.0


def fit(tmp_path: Path, lr: float) -> list[tuple[int, dict[str, float]]]:
    overrides = [o.replace("COLLAPSE_STEPS", str(COLLAPSE_STEPS)) for o in BASE]
    cfg = load_config([*overrides, f"actor_rollout_ref.actor.optim.lr={lr}", f"trainer.default_local_dir={tmp_path}"])
    actor, critic = build_workers(cfg, "cpu", local=True)
    return build_trainer(cfg, prepare(cfg), actor, critic).fit()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_entropy_collapse_stops_the_run_after_a_checkpoint(tmp_path, caplog):
    history = fit(tmp_path, COLLAPSE_LR)
    last_step, last = history[-1]
    assert last_step < COLLAPSE_STEPS  # stopped early
    assert last["health/warn_entropy_collapse"] == 1.0
    assert last["actor/entropy"] < 0.25 * history[0][1]["actor/entropy"]
    assert (tmp_path / f"global_step_{last_step}" / "actor").is_dir()  # the checkpoint came first
    assert "stopping at step" in caplog.text and "entropy_collapse" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_normal_learning_rate_stays_silent(tmp_path):
    history = fit(tmp_path, 1e-6)
    assert [s for s, _ in history] == list(range(1, COLLAPSE_STEPS + 1))
    flags = {k: v for _, m in history for k, v in m.items() if k.startswith("health/warn_")}
    assert flags and not any(flags.values())
