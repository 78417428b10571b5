"""A run's configuration, ready to use: composed with Hydra, typed (``search_rl/config/``), then resolved.

Resolution is the one place where names in the config are checked against the registries (advantage estimators,
policy losses, KL estimators, loss aggregations, reward functions) and where the defaults that depend on them are
filled (``rollout.engine=auto`` from whether vLLM is installed and runs the model, ``rollout.n`` and
``critic.enable`` from what the estimator needs, ``algorithm.tis_cap`` from whether the sampler is the trainer). It
runs before Ray starts, so a wrong name fails in a second with the key named. The config dataclasses themselves hold
data and range checks only, and never import the registries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from search_rl.algorithms import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, estimator_needs
from search_rl.config import AlgorithmConfig, ConfigError, EvalConfig, PPOConfig, RewardConfig
from search_rl.config.loading import compose_config, to_typed
from search_rl.config.ppo import DEFAULT_GROUP_SIZE, DEFAULT_TIS_CAP
from search_rl.registry import Registry
from search_rl.reward import REWARDS
from search_rl.rollout.engines.choice import choose_engine

logger = logging.getLogger(__name__)

C = TypeVar("C")


def load_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> Any:
    """Compose ``configs/<config_name>.yaml`` with command-line style overrides, type it and resolve it.

    Raises:
        ConfigError / ValueError: a key that moved, a field out of range, a name no registry has, an estimator the
            run cannot serve. hydra/omegaconf errors: an unknown key or a value of the wrong type.
    """
    return resolve(compose_config(overrides, config_name))


def to_config(composed: object) -> Any:
    """The typed, resolved config of a composed ``DictConfig`` (what ``@hydra.main`` hands an entry point)."""
    return resolve(to_typed(composed))


def resolve(cfg: C) -> C:
    """Check registry names and fill the defaults that depend on them, in place; returns ``cfg``.

    Raises:
        ValueError: a name no registry has (the key and the reason named).
        ConfigError: an estimator the run cannot serve (groups of one sample, no critic).
    """
    algorithm = getattr(cfg, "algorithm", None)
    if isinstance(algorithm, AlgorithmConfig):
        check_algorithm_names(algorithm)
    reward = getattr(cfg, "reward", None)
    if isinstance(reward, RewardConfig):
        check_reward_names(reward)
    if isinstance(cfg, PPOConfig):
        device = cfg.trainer.device
        resolve_engine(cfg.actor_rollout_ref.rollout, cfg.model.path, device == "cuda" or device == "auto" and _cuda())
        fill_estimator_defaults(cfg)
    if isinstance(cfg, EvalConfig):
        resolve_engine(cfg.actor_rollout_ref.rollout, cfg.model.path, _cuda())
    return cfg


def resolve_engine(rollout: Any, model_path: str, gpu: bool) -> None:
    """Replace ``rollout.engine=auto`` by a named engine (``search_rl.rollout.engines.choice``), logging why."""
    if rollout.engine == "auto":
        rollout.engine, why = choose_engine(model_path, gpu)
        logger.info("actor_rollout_ref.rollout.engine=auto -> %s (%s)", rollout.engine, why)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_algorithm_names(algo: AlgorithmConfig) -> None:
    """Every name in ``algorithm.*`` resolves in its registry (or is an importable ``pkg.module:attr``)."""
    registries: Mapping[str, Registry[Any]] = {
        "adv_estimator": ADVANTAGES,
        "policy_loss": POLICY_LOSSES,
        "kl_reward_type": KL_ESTIMATORS,
        "kl_loss_type": KL_ESTIMATORS,
        "loss_agg_mode": LOSS_AGGREGATIONS,
    }
    for key, registry in registries.items():
        _check_name(f"algorithm.{key}", getattr(algo, key), registry)


def check_reward_names(reward: RewardConfig) -> None:
    """``reward.default`` and every ``reward.by_data_source`` value name a reward function."""
    _check_name("reward.default", reward.default, REWARDS)
    for source, name in reward.by_data_source.items():
        _check_name(f"reward.by_data_source.{source}", name, REWARDS)


def fill_estimator_defaults(cfg: PPOConfig) -> None:
    """``rollout.n``, ``critic.enable`` and ``algorithm.tis_cap`` where left null, then the estimator's needs.

    Raises:
        ConfigError: the estimator compares samples of a prompt but ``rollout.n`` < 2, or needs a critic the run
            turned off.
    """
    algo, rollout, needs = cfg.algorithm, cfg.actor_rollout_ref.rollout, estimator_needs(cfg.algorithm.adv_estimator)
    if rollout.n is None:
        rollout.n = DEFAULT_GROUP_SIZE if needs.groups else 1
    if cfg.critic.enable is None:
        cfg.critic.enable = needs.critic
    if algo.tis_cap is None:  # a sampler other than the trainer: correct for it
        mismatch = cfg.trainer.samples_may_be_stale or not cfg.engine_matches_trainer
        algo.tis_cap = DEFAULT_TIS_CAP if mismatch else 0.0
    if needs.groups and cfg.n_samples < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={algo.adv_estimator} compares the samples of each prompt, but "
            f"actor_rollout_ref.rollout.n={cfg.n_samples}; set it to 2 or more (Search-R1 uses 5)"
        )
    if needs.critic and not cfg.use_critic:
        raise ConfigError(f"algorithm.adv_estimator={algo.adv_estimator} needs a critic; set critic.enable=true")


def _check_name(key: str, name: str, registry: Registry[Any]) -> None:
    try:
        registry.get(name)
    except (KeyError, ImportError, AttributeError) as e:
        reason = e.args[0] if e.args else repr(e)  # KeyError's str() would add quotes
        raise ValueError(f"{key}={name!r} is not usable: {reason}") from e
