"""bench/learning_bench.py builds command lines the trainers accept, with the profile's settings in force."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from search_rl.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("learning_bench", REPO / "bench" / "learning_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["learning_bench"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_merge_overrides_keeps_the_last_value_of_a_key_in_its_first_place(bench: ModuleType) -> None:
    merged = bench.merge_overrides(["a=1", "b=2"], ("a=3", "c=4"), ["b=5"])
    assert merged == ["a=3", "b=5", "c=4"]


@pytest.mark.parametrize("profile", ["full", "quick", "long", "recipe"])
def test_every_profile_composes_under_the_real_configs(bench: ModuleType, profile: str, tmp_path: Path) -> None:
    """The commands name each key once and the composed configs carry the profile's budgets."""
    budget = bench.PROFILES[profile]
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", budget)
    sft_command = b.sft_command(tmp_path / "sft")
    sft = load_config(sft_command, config_name="sft_trainer")
    assert sft.trainer.total_training_steps == budget.sft_steps
    assert sft.actor_rollout_ref.rollout.max_obs_tokens == budget.max_obs_tokens
    for algorithm in ("grpo", "ppo"):
        rl_command = b.rl_command(algorithm, tmp_path / "sft" / "global_step_1", tmp_path / algorithm)
        for command in (sft_command, rl_command):
            keys = [o.partition("=")[0] for o in command]
            assert len(keys) == len(set(keys)), keys
        ppo = load_config(rl_command)
        assert ppo.trainer.total_training_steps == budget.rl_steps
        assert ppo.actor_rollout_ref.rollout.max_turn_tokens == budget.max_turn_tokens
        assert ppo.actor_rollout_ref.rollout.max_obs_tokens == budget.max_obs_tokens
        assert ppo.trainer.test_freq == budget.val_every


def test_the_recipe_profile_trains_lora_at_its_own_learning_rates(bench: ModuleType, tmp_path: Path) -> None:
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE)
    sft = load_config(b.sft_command(tmp_path / "sft"), config_name="sft_trainer")
    assert sft.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-4)
    assert sft.actor_rollout_ref.actor.optim.lr_warmup_steps == 2
    grpo = load_config(b.rl_command("grpo", tmp_path / "sft" / "global_step_12", tmp_path / "grpo"))
    assert grpo.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-4)  # RL_DEFAULTS' 1e-5 replaced, not repeated
    assert (grpo.model.lora_rank, grpo.model.lora_alpha) == (16, 32)
    assert grpo.trainer.val_before_train is True


def test_a_command_line_override_wins_over_the_profile(bench: ModuleType, tmp_path: Path) -> None:
    b = bench.Bench(
        tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE, rl_overrides=["actor_rollout_ref.actor.optim.lr=3e-5"]
    )
    grpo = load_config(b.rl_command("grpo", tmp_path / "start", tmp_path / "grpo"))
    assert grpo.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-5)
