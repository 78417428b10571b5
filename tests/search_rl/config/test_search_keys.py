"""``do_search`` and ``max_turns``: the top-level key (Search-R1's) and ``actor_rollout_ref.rollout.<key>`` are one
setting in every entry point, whether the config is built in Python or composed from YAML.

Run: python -m pytest tests/search_rl/config/test_search_keys.py -q
"""

from __future__ import annotations

import pytest

from search_rl.config import ConfigError, EvalConfig, PPOConfig, SFTConfig
from search_rl.config.eval import EvalActorRolloutRefConfig, EvalRolloutConfig
from search_rl.config.roles import ActorRolloutRefConfig
from search_rl.config.rollout import TrainRolloutConfig
from search_rl.config.sft import SFTRolloutConfig
from search_rl.configure import load_config

ROOTS = [PPOConfig, SFTConfig, EvalConfig]


@pytest.mark.parametrize("root", ROOTS)
def test_the_top_level_key_built_in_python_reaches_the_rollout(root):
    cfg = root(max_turns=2, do_search=False)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.max_turns, rollout.do_search) == (2, False)
    assert (cfg.max_turns, cfg.do_search) == (2, False)


def _with_rollout(root: type, **kwargs: object) -> object:
    if root is PPOConfig:
        return PPOConfig(actor_rollout_ref=ActorRolloutRefConfig(rollout=TrainRolloutConfig(**kwargs)))
    if root is SFTConfig:
        return SFTConfig(actor_rollout_ref=SFTRolloutConfig(rollout=TrainRolloutConfig(engine="hf", **kwargs)))
    return EvalConfig(actor_rollout_ref=EvalActorRolloutRefConfig(rollout=EvalRolloutConfig(**kwargs)))


@pytest.mark.parametrize("root", ROOTS)
def test_the_rollout_key_set_alone_reaches_the_top_level(root):
    cfg = _with_rollout(root, max_turns=1, do_search=False)
    assert (cfg.max_turns, cfg.do_search) == (1, False)


@pytest.mark.parametrize("root", ROOTS)
def test_two_different_values_are_refused_naming_both_keys(root):
    with pytest.raises(ConfigError, match=r"max_turns=3 and actor_rollout_ref\.rollout\.max_turns=1 .* disagree"):
        root(max_turns=3, actor_rollout_ref=_with_rollout(root, max_turns=1).actor_rollout_ref)


@pytest.mark.parametrize(
    ("config_name", "overrides"),
    [
        ("ppo_trainer", ["max_turns=2", "do_search=false"]),
        ("ppo_trainer", ["actor_rollout_ref.rollout.max_turns=2", "actor_rollout_ref.rollout.do_search=false"]),
        ("sft_trainer", ["actor_rollout_ref.rollout.max_turns=2", "actor_rollout_ref.rollout.do_search=false"]),
        ("eval", ["max_turns=2", "do_search=false"]),
        ("eval", ["actor_rollout_ref.rollout.max_turns=2", "actor_rollout_ref.rollout.do_search=false"]),
    ],
)
def test_either_key_on_the_command_line_sets_both(config_name, overrides):
    cfg = load_config(overrides, config_name=config_name)
    assert (cfg.max_turns, cfg.do_search) == (2, False)
    assert (cfg.actor_rollout_ref.rollout.max_turns, cfg.actor_rollout_ref.rollout.do_search) == (2, False)


def test_both_keys_on_the_command_line_must_agree():
    with pytest.raises(ConfigError, match="max_turns=3 and actor_rollout_ref.rollout.max_turns=2"):
        load_config(["max_turns=3", "actor_rollout_ref.rollout.max_turns=2"], config_name="eval")
