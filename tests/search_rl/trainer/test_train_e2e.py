"""End to end on CPU: the trainer on Ray with 2 data-parallel workers, the tiny random Llama and a real BM25 server.

- PPO (GAE, critic) for 3 steps: finite losses, the actor and the critic change, validation per data source,
  checkpoints, metrics and rollout dumps on disk, the engines serve weight version ``step - 1`` each step.
- GRPO for 2 steps (4 samples per prompt, no critic).
- Kill and resume: a run dies in the middle of step 3 (after the step-2 checkpoint; its workers are killed), a new
  run with ``trainer.resume=auto`` continues, and its step-3 metrics equal the uninterrupted run's bit for bit; the
  same comparison catches a resume from that checkpoint with the actor's Adam moments dropped.

The random model never answers, so a test reward (``checksum_reward.py``: a checksum of the sampled tokens, varied
within groups) gives the advantages something to work with.

Run: python -m pytest tests/search_rl/trainer/test_train_e2e.py -q   (about 2-3 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from checksum_reward import CHECKSUM_REWARD

from search_rl.config import ConfigError
from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare, run
from search_rl.models import build_tiny_model, load_model
from search_rl.state_files import load_state
from search_rl.tracking.jsonl import read_jsonl

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration]

TEST_REWARD = CHECKSUM_REWARD  # registered by the import
NOISY_KEYS = ("timing/", "perf/tokens_per_s", "perf/actor_update_tokens_per_s", "rollout/gen_tokens_per_s")


def _overrides(run_dir: Path, url: str, *extra: str) -> list[str]:
    return [
        "model=tiny",
        f"retriever.url={url}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.n_workers=2",
        "trainer.torch_threads_per_worker=1",
        "trainer.cpus_per_worker=0.25",
        "trainer.logger=[jsonl]",
        "trainer.max_ckpt_to_keep=0",
        "trainer.worker_timeout_s=300",
        "max_turns=2",
        "actor_rollout_ref.rollout.max_turn_tokens=24",
        "actor_rollout_ref.rollout.max_obs_tokens=96",
        "actor_rollout_ref.rollout.max_response_tokens=160",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.optim.lr=1e-3",
        "algorithm.entropy_coeff=0.01",
        "data.val_max_samples=4",
        f"reward.default={TEST_REWARD}",
        f"+reward.by_data_source.nq={TEST_REWARD}",
        f"+reward.by_data_source.hotpotqa={TEST_REWARD}",
        *extra,
    ]


PPO = (
    "trainer.total_training_steps=3",
    "trainer.save_freq=2",
    "trainer.test_freq=2",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
)


def _metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before if k in after)


@pytest.fixture(scope="module")
def ppo_run(ray_local, retriever_url, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ppo")
    history = run(load_config(_overrides(run_dir, retriever_url, *PPO)))
    return run_dir, dict(history)


def test_ppo_with_critic_trains_on_two_workers(ppo_run, tokenizer):
    run_dir, history = ppo_run
    assert sorted(history) == [1, 2, 3]
    for step, m in history.items():
        for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "critic/vf_loss", "actor/grad_norm"):
            assert math.isfinite(m[key]), (step, key)
        assert m["rollout/weight_version"] == step - 1  # each step samples with the previous step's weights
        assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)
        assert {"reward/nq/score", "timing/rollout_s", "timing/update_critic_s", "perf/tokens_per_s"} <= set(m)
    assert any(m["actor/grad_norm"] > 0 for m in history.values())
    assert {"val/all/em", "val/nq/answer_rate", "val/all/searches"} <= set(history[2])
    assert sorted(_metrics(run_dir)) == [1, 2, 3]

    ckpt = run_dir / "global_step_2"
    assert {p.name for p in ckpt.iterdir()} == {
        "actor",
        "actor_optim.pt",
        "critic",
        "critic_optim.pt",
        "trainer_state.pt",
    }
    assert (run_dir / "global_step_3").is_dir() and (run_dir / ".hydra").exists() is False
    trained = load_model(str(ckpt / "actor")).state_dict()
    assert _changed(build_tiny_model(tokenizer, seed=0).state_dict(), trained)
    from safetensors.torch import load_file

    head = load_file(str(ckpt / "critic" / "model.safetensors"))["value_head.weight"]
    assert head.abs().sum() > 0  # the critic's zero-initialised head learned

    dumps = sorted(p.name for p in (run_dir / "rollouts").iterdir())
    assert dumps == [
        "train_step_000001.jsonl",
        "train_step_000002.jsonl",
        "train_step_000003.jsonl",
        "val_step_000002.jsonl",
        "val_step_000003.jsonl",
    ]
    record = read_jsonl(run_dir / "rollouts" / "train_step_000002.jsonl")[0]
    assert record["weight_version"] == 1 and record["mask_spans"] and record["advantage"] is not None


def test_grpo_trains_on_two_workers(ray_local, retriever_url, tmp_path):
    cfg = load_config(
        _overrides(
            tmp_path,
            retriever_url,
            "algorithm=grpo",
            "trainer.total_training_steps=2",
            "trainer.save_freq=0",
            "trainer.test_freq=0",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        )
    )
    assert (cfg.n_samples, cfg.use_critic) == (4, False)
    history = dict(run(cfg))
    assert sorted(history) == [1, 2]
    for m in history.values():
        assert math.isfinite(m["actor/loss"]) and math.isfinite(m["actor/kl_loss"])
        assert "critic/vf_loss" not in m and 0 <= m["reward/groups_all_equal"] <= 1
    assert history[2]["actor/kl_loss"] > 0  # the policy moved away from the reference
    assert not list(tmp_path.glob("global_step_*"))


def resumed_mismatches(got: dict[str, float], expected: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The metrics (``NOISY_KEYS`` aside) where a resumed step differs from the uninterrupted run's, as (got, expected).

    The bound is 0. Both runs are the same code on the same machine in the same layout (2 workers of 1 torch thread,
    the same micro-batches, ``_overrides``) and start step 3 from bitwise-equal state: float32 weights and Adam's
    moments round-trip exactly through safetensors and ``torch.save``, and the loader's and samplers' RNG states are
    restored. So every sum is taken in the same order on the same values, and a metric differs only if the state did.
    A resume that loses the actor's Adam moments (``_drop_adam_moments``) changes only what step 3's first mini-batch
    leaves for the second to measure: measured, the step's loss moves by 4.8e-5 (4e-4 relative) and its pg_loss by
    4.9e-5, both inside the ``reorder_tol(total tokens)`` (~1e-3) this comparison had allowed.
    """
    keys = {k for k in expected if not k.startswith(NOISY_KEYS)}
    if keys != {k for k in got if not k.startswith(NOISY_KEYS)}:
        raise AssertionError(f"the resumed step logged other metrics: {sorted(keys ^ set(got))}")
    same = {k for k in keys if got[k] == expected[k] or (math.isnan(got[k]) and math.isnan(expected[k]))}
    return {k: (got[k], expected[k]) for k in sorted(keys - same)}


def _drop_adam_moments(run_dir: Path, step: int) -> None:
    """The planted bug: the actor's optimizer state in ``global_step_{step}`` as a fresh AdamW's (step 0, moments 0),
    the weights and schedule kept: a resume that restores the weights and loses Adam's state."""
    path = run_dir / f"global_step_{step}" / "actor_optim.pt"
    state = load_state(path)
    for param in state["optimizer"]["state"].values():
        for name, value in param.items():
            param[name] = torch.zeros_like(value) if isinstance(value, torch.Tensor) else 0  # step, exp_avg(_sq)
    torch.save(state, path)


def test_killed_run_resumes_and_reproduces_the_next_step(ppo_run, retriever_url, tmp_path):
    reference_dir, reference = ppo_run
    run_dir, dropped_dir = tmp_path / "run", tmp_path / "dropped"
    cfg = load_config(_overrides(run_dir, retriever_url, *PPO))
    prepared = prepare(cfg)
    actor, critic = build_workers(cfg, "cpu")
    trainer = build_trainer(cfg, prepared, actor, critic)
    step = trainer.step_fn
    update_actor = step.update_actor

    def dies_in_step_3(batch):
        if step.step == 3:
            raise RuntimeError("killed in the middle of step 3")
        return update_actor(batch)

    step.update_actor = dies_in_step_3
    try:
        with pytest.raises(RuntimeError, match="killed in the middle of step 3"):
            trainer.fit()
    finally:
        actor.shutdown()  # the worker processes die with whatever they held
        critic.shutdown()
    assert sorted(_metrics(run_dir)) == [1, 2] and not (run_dir / "global_step_3").exists()
    shutil.copytree(run_dir, dropped_dir)

    resumed = dict(run(load_config(_overrides(run_dir, retriever_url, *PPO, "trainer.resume=auto"))))
    assert sorted(resumed) == [3]
    assert resumed_mismatches(resumed[3], reference[3]) == {}
    assert sorted(_metrics(run_dir)) == [1, 2, 3]

    _drop_adam_moments(dropped_dir, 2)
    broken = dict(run(load_config(_overrides(dropped_dir, retriever_url, *PPO, "trainer.resume=auto"))))
    missed = resumed_mismatches(broken[3], reference[3])
    assert {"actor/loss", "actor/pg_loss"} <= set(missed), missed  # the second mini-batch saw other weights


def test_without_ray_the_driver_trains_in_process(retriever_url, tmp_path):
    # trainer.use_ray=false: one worker per group inside this process, the same FSDP2 path (single-GPU boxes)
    overrides = [o for o in _overrides(tmp_path, retriever_url) if not o.startswith("trainer.n_workers")]
    cfg = load_config(
        [
            *overrides,
            "trainer.use_ray=false",
            "algorithm=grpo",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.test_freq=0",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        ]
    )
    history = dict(run(cfg))
    assert sorted(history) == [1] and history[1]["perf/actor_update_tokens"] > 0
    assert (tmp_path / "global_step_1" / "actor" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="use_ray=false"):
        load_config([*overrides, "trainer.use_ray=false", "trainer.n_workers=2"])
