"""``AlgorithmConfig`` validation: defaults, bad values; its registry names, checked by ``configure.resolve``
(listing the available ones).

Run: python -m pytest tests/search_rl/algorithms/test_algorithm_config.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from search_rl.algorithms import ADVANTAGES
from search_rl.config import AlgorithmConfig
from search_rl.configure import check_algorithm_names


def test_defaults_are_valid_and_documented():
    cfg = AlgorithmConfig()
    assert cfg.adv_estimator == "gae" and cfg.policy_loss == "ppo_clip" and cfg.mask_observations
    names = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert {"gamma", "lam", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "kl_horizon"} <= names


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce_plus_plus", "remax"])
def test_every_registered_estimator_is_accepted(name: str):
    assert name in ADVANTAGES
    check_algorithm_names(AlgorithmConfig(adv_estimator=name))


def test_unknown_estimator_lists_available_names():
    with pytest.raises(
        ValueError, match=r"adv_estimator='ppo'.*registered: gae, grpo, reinforce_plus_plus, remax, rloo"
    ):
        check_algorithm_names(AlgorithmConfig(adv_estimator="ppo"))


def test_import_string_estimator_is_resolved_up_front():
    cfg = AlgorithmConfig(adv_estimator="search_rl.algorithms.advantages:compute_rloo_advantages")
    check_algorithm_names(cfg)
    assert ADVANTAGES.get(cfg.adv_estimator) is ADVANTAGES.get("rloo")
    with pytest.raises(ValueError, match="adv_estimator"):
        check_algorithm_names(AlgorithmConfig(adv_estimator="search_rl.algorithms.advantages:nope"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy_loss": "ppo"}, "registered: gspo, ppo_clip"),
        ({"kl_loss_type": "full"}, "registered: k1, k2, k3, kl, low_var_kl, mse"),
        ({"kl_reward_type": "abs"}, "kl_reward_type"),
        ({"loss_agg_mode": "mean"}, "token-mean"),
        ({"kl_ctrl_type": "pid"}, "kl_ctrl_type must be one of"),
        ({"gamma": 1.5}, "gamma must be in"),
        ({"lam": -0.1}, "lam must be in"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low must be in"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high must be >= 0"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c must be > 1"),
        ({"entropy_coeff": -1.0}, "entropy_coeff must be >= 0"),
        ({"kl_target": 0.0}, "kl_target must be > 0"),
        ({"kl_horizon": 0}, "kl_horizon must be >= 1"),
    ],
)
def test_bad_values_are_clear_errors(overrides: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        check_algorithm_names(AlgorithmConfig(**overrides))  # type: ignore[arg-type]
