"""``configure.resolve``: registry names checked and estimator-dependent defaults filled, in one place.

Run: python -m pytest tests/search_rl/config/test_configure.py -q
"""

from __future__ import annotations

import pytest

from search_rl.config import ConfigError, compose_config
from search_rl.configure import load_config, resolve


def test_composed_config_is_unresolved_until_resolve():
    cfg = compose_config(["algorithm=grpo"])
    assert cfg.actor_rollout_ref.rollout.n is None and cfg.critic.enable is None and cfg.algorithm.tis_cap is None
    resolve(cfg)
    assert (cfg.n_samples, cfg.use_critic, cfg.algorithm.tis_cap) == (4, False, 0.0)


def test_estimator_defaults_follow_the_estimator_and_the_sampler():
    ppo = load_config(["algorithm=ppo"])
    assert (ppo.n_samples, ppo.use_critic) == (1, True)
    stale = load_config(["algorithm=grpo", "trainer.mode=one_step_off"])
    assert stale.algorithm.tis_cap == 2.0, "samples of older weights: truncated importance sampling on"
    assert load_config(["algorithm=grpo", "actor_rollout_ref.rollout.n=6"]).n_samples == 6, "an explicit n stays"


def test_reward_names_are_checked_with_the_key_named():
    with pytest.raises(ValueError, match=r"reward.by_data_source.nq='qa_emm' is not usable"):
        load_config(["+reward.by_data_source.nq=qa_emm"])
    with pytest.raises(ValueError, match=r"reward.default='nope' is not usable"):
        load_config(["reward.default=nope"])


def test_estimator_needs_are_checked():
    with pytest.raises(ConfigError, match="compares the samples of each prompt"):
        load_config(["algorithm=grpo", "actor_rollout_ref.rollout.n=1"])
    with pytest.raises(ConfigError, match="needs a critic"):
        load_config(["algorithm.adv_estimator=gae", "critic.enable=false"])
