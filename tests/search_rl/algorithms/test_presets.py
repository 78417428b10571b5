"""The algorithm presets (``algorithm=ppo|grpo|dr_grpo|dapo|gspo``) compose to their published settings, and the
new keys (``algorithm.filter_groups.*``, ``trainer.critic_warmup``) fail with errors naming the key.

Run: python -m pytest tests/search_rl/algorithms/test_presets.py -q
"""

from __future__ import annotations

import pytest

from search_rl.config import ConfigError
from search_rl.config.algorithm import FilterGroupsConfig
from search_rl.configure import load_config


def _algo(cfg) -> dict[str, object]:
    a = cfg.algorithm
    return {
        "adv": a.adv_estimator,
        "std": a.norm_adv_by_std,
        "loss": a.policy_loss,
        "clip": (a.clip_ratio_low, a.clip_ratio_high),
        "agg": a.loss_agg_mode,
        "kl": (a.use_kl_loss, a.use_kl_in_reward),
        "entropy": a.entropy_coeff,
        "filter": a.filter_groups.enable,
    }


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        # Search-R1 sets entropy_coeff 0.001 (its verl ppo_trainer.yaml, kept by train_ppo.sh / train_grpo.sh)
        ("ppo", ("gae", True, "ppo_clip", (0.2, 0.2), "token-mean", (False, True), 0.001, False)),
        ("grpo", ("grpo", True, "ppo_clip", (0.2, 0.2), "token-mean", (True, False), 0.001, False)),
        ("dr_grpo", ("grpo", False, "ppo_clip", (0.2, 0.2), "seq-mean-token-sum-norm", (False, False), 0.0, False)),
        ("dapo", ("grpo", True, "ppo_clip", (0.2, 0.28), "token-mean", (False, False), 0.0, True)),
        ("gspo", ("grpo", True, "gspo", (3e-4, 4e-4), "seq-mean-token-mean", (False, False), 0.0, False)),
    ],
)
def test_presets_compose_to_their_published_settings(preset, expected):
    cfg = load_config([f"algorithm={preset}"])
    keys = ("adv", "std", "loss", "clip", "agg", "kl", "entropy", "filter")
    assert _algo(cfg) == dict(zip(keys, expected, strict=True))
    assert cfg.use_critic == (preset == "ppo") and cfg.n_samples == (1 if preset == "ppo" else 4)
    assert cfg.use_reference == (preset in ("ppo", "grpo"))
    cfg.validate(max_model_len=8192)  # every preset passes the cross-field checks with the default budgets


def test_dapo_sets_dynamic_sampling_and_the_overlong_penalty_outside_algorithm():
    cfg = load_config(["algorithm=dapo"])
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "em", 10)
    assert cfg.algorithm.clip_ratio_c == 10.0
    assert (cfg.reward.overlong_buffer_tokens, cfg.reward.overlong_penalty_factor) == (205, 1.0)
    # one fifth of the default budget, as DAPO's 4096 of 20480
    assert cfg.reward.overlong_buffer_tokens == round(cfg.actor_rollout_ref.rollout.max_response_tokens / 5)
    # the other presets leave reward.* alone, and command-line overrides still win over the preset
    assert load_config(["algorithm=grpo"]).reward.overlong_buffer_tokens == 0
    over = load_config(["algorithm=dapo", "reward.overlong_buffer_tokens=50", "algorithm.filter_groups.metric=score"])
    assert (over.reward.overlong_buffer_tokens, over.algorithm.filter_groups.metric) == (50, "score")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            # an estimator without groups, so that only dynamic sampling needs rollout.n >= 2
            ["algorithm=dapo", "algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1"],
            "algorithm.filter_groups.enable keeps groups whose rewards differ, but actor_rollout_ref.rollout.n=1",
        ),
        (["algorithm=grpo", "trainer.critic_warmup=2"], "trainer.critic_warmup=2 warms up a critic, but the run has"),
        (
            [
                "algorithm=dapo",
                "actor_rollout_ref.rollout.max_response_tokens=200",
                "actor_rollout_ref.rollout.max_turn_tokens=100",
            ],
            "reward.overlong_buffer_tokens=205 must be below actor_rollout_ref.rollout.max_response_tokens=200",
        ),
    ],
)
def test_cross_field_errors_name_the_keys(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides).validate(max_model_len=8192)


def test_single_field_errors_name_the_keys():
    with pytest.raises(ValueError, match="algorithm.filter_groups.max_num_gen_batches must be >= 1"):
        load_config(["algorithm.filter_groups.max_num_gen_batches=0"])
    with pytest.raises(ValueError, match="algorithm.filter_groups.metric is empty"):
        FilterGroupsConfig(metric="")
    with pytest.raises(ConfigError, match="trainer.critic_warmup must be >= 0"):
        load_config(["trainer.critic_warmup=-1"])
    with pytest.raises(ValueError, match="algorithm.policy_loss='gspoo' is not usable"):
        load_config(["algorithm.policy_loss=gspoo"])
    load_config(["algorithm=ppo", "trainer.critic_warmup=3"]).validate(max_model_len=8192)  # with a critic: fine
