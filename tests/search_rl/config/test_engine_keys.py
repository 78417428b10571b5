"""The engine keys of ``actor_rollout_ref.rollout`` (``engine``, ``hf``, ``static``, ``vllm``,
``gpu_memory_utilization``) are written once (``EngineRolloutConfig``) and mean the same in training and evaluation,
under the same key paths.

Run: python -m pytest tests/search_rl/config/test_engine_keys.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from search_rl.config import ConfigError, EngineRolloutConfig, EvalRolloutConfig, TrainRolloutConfig
from search_rl.configure import load_config

ENGINE_KEYS = {f.name for f in dataclasses.fields(EngineRolloutConfig)} - {
    f.name for f in dataclasses.fields(EngineRolloutConfig.__mro__[1])
}


def test_the_engine_fields_are_declared_once():
    assert sorted(ENGINE_KEYS) == ["engine", "gpu_memory_utilization", "hf", "static", "vllm"]
    for cls in (TrainRolloutConfig, EvalRolloutConfig):
        assert not ENGINE_KEYS & set(cls.__dict__.get("__annotations__", {})), f"{cls.__name__} redeclares them"


@pytest.mark.parametrize("config_name", ["ppo_trainer", "sft_trainer", "eval"])
def test_the_same_keys_set_the_engine_in_every_entry_point(config_name):
    cfg = load_config(
        [
            "actor_rollout_ref.rollout.engine=static",
            "actor_rollout_ref.rollout.hf.max_batch_size=8",
            "actor_rollout_ref.rollout.vllm.kv_cache_gib=1.5",
        ],
        config_name=config_name,
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.engine, rollout.hf.max_batch_size, rollout.vllm.kv_cache_gib) == ("static", 8, 1.5)


@pytest.mark.parametrize("config_name", ["ppo_trainer", "eval"])
def test_an_unknown_engine_is_refused_alike(config_name):
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.engine must be one of .*got 'sglang'"):
        load_config(["actor_rollout_ref.rollout.engine=sglang"], config_name=config_name)


def test_vllm_takes_less_of_the_gpu_beside_a_trainer():
    assert load_config([]).actor_rollout_ref.rollout.gpu_memory_utilization == 0.4
    assert load_config([], config_name="eval").actor_rollout_ref.rollout.gpu_memory_utilization == 0.9
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        EvalRolloutConfig(gpu_memory_utilization=1.5)
