"""The asynchronous modes' configuration: bad values name their key, impossible combinations are refused before Ray
starts, and each mode becomes the coordinator's schedule (no Ray, no models).

Run: python -m pytest tests/search_rl/async_rollout/test_async_config.py -q   (a few seconds)
"""

from __future__ import annotations

import pytest

from search_rl.async_rollout.build import source_settings
from search_rl.config import ConfigError, TrainerConfig
from search_rl.configure import load_config
from search_rl.main_ppo import check_mode


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "overlap"}, "trainer.mode must be one of"),
        ({"n_generators": 0}, "trainer.n_generators must be >= 1"),
        ({"max_staleness": -1}, "trainer.max_staleness must be >= 0"),
        ({"max_queue_batches": 0}, "trainer.max_queue_batches must be >= 1"),
        ({"max_generator_restarts": -2}, "trainer.max_generator_restarts must be >= 0"),
        ({"mode": "async", "use_ray": False}, "trainer.mode=async runs generator actors on Ray"),
        ({"mode": "one_step_off", "n_generators": 2}, "trainer.mode=one_step_off overlaps one batch"),
    ],
)
def test_bad_trainer_mode_settings_name_their_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(**kwargs)


def test_the_defaults_are_the_synchronous_loop():
    t = TrainerConfig()
    assert (t.mode, t.n_generators, t.max_staleness, t.max_queue_batches) == ("sync", 1, 1, 2)


def test_dynamic_sampling_is_refused_in_the_asynchronous_modes():
    cfg = load_config(["trainer.mode=async", "algorithm=grpo"])
    if not hasattr(cfg.algorithm, "filter_groups"):
        pytest.skip("algorithm.filter_groups (dynamic sampling) is not in this tree")
    check_mode(cfg)  # off: fine
    cfg = load_config(["trainer.mode=async", "algorithm=grpo", "algorithm.filter_groups.enable=true"])
    with pytest.raises(ConfigError, match="algorithm.filter_groups.enable=true .* trainer.mode=async"):
        check_mode(cfg)


def test_each_mode_becomes_the_coordinators_schedule():
    one_off = source_settings(load_config(["trainer.mode=one_step_off", "data.train_batch_size=3"]))
    assert (one_off.max_staleness, one_off.capacity_groups, one_off.groups_per_step) == (1, 3, 3)
    cfg = load_config(
        [
            "trainer.mode=async",
            "data.train_batch_size=4",
            "trainer.max_staleness=2",
            "trainer.max_queue_batches=3",
            "trainer.max_generator_restarts=5",
            "trainer.worker_timeout_s=77",
        ]
    )
    s = source_settings(cfg)
    assert (s.max_staleness, s.capacity_groups, s.groups_per_step, s.n_shards) == (2, 12, 4, 1)
    assert (s.max_restarts, s.timeout_s) == (5, 77.0)


@pytest.mark.parametrize(
    ("overrides", "cap"),
    [
        ([], 0.0),  # sync: samples come from the weights being trained
        (["trainer.mode=one_step_off"], 2.0),
        (["trainer.mode=async", "trainer.max_staleness=1"], 2.0),
        (["trainer.mode=async", "trainer.max_staleness=0"], 0.0),  # never stale: exactly sync
        (["trainer.mode=async", "algorithm.tis_cap=0"], 0.0),  # an explicit choice stays
        (["algorithm.tis_cap=3"], 3.0),
        (["model.dtype=bfloat16"], 2.0),  # the engine's bf16 log-probs are not the trainer's
        (["rollout=vllm"], 2.0),
    ],
)
def test_tis_is_on_exactly_where_the_sampler_is_not_the_trainer(overrides, cap):
    assert load_config(["model=tiny", *overrides]).algorithm.tis_cap == cap
