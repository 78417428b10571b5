"""A run's configuration, ready to use: composed with Hydra, typed (``search_rl/config/``), then resolved.

Resolution is the one place where names in the config are checked against the registries (advantage estimators,
policy losses, KL estimators, loss aggregations, reward functions, the rollout's tool classes) and where the defaults
that depend on them are filled (``rollout.engine=auto`` from whether vLLM is installed and runs the model,
``model.dtype=auto`` from the device and what it computes fast (``search_rl.models.compute_dtype``), ``rollout.n`` and
``critic.enable`` from what the estimator needs, ``algorithm.tis_cap`` from whether the sampler is the trainer). It
runs before Ray starts, so a wrong name fails in a second with the key named. The config dataclasses themselves hold
data and range checks only, and never import the registries.

Once the engine and the device are known, a rollout setting that cannot apply where it runs is never dropped
silently (``check_engine_settings``, with the engine choice in ``search_rl.rollout.engines.choice``): it is refused
with a ``ConfigError`` when the user named both it and the engine, and warned about once when ``engine=auto`` made
the choice or the setting only partly applies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from search_rl.algorithms import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, estimator_needs
from search_rl.config import (
    AlgorithmConfig,
    ConfigError,
    EvalConfig,
    ModelConfig,
    PPOConfig,
    RewardConfig,
    RolloutConfig,
    SFTConfig,
)
from search_rl.config.loading import compose_config, to_typed
from search_rl.config.ppo import DEFAULT_GROUP_SIZE, DEFAULT_TIS_CAP
from search_rl.models.compute_dtype import AUTO, resolve_compute_dtype
from search_rl.registry import Registry
from search_rl.reward import REWARDS
from search_rl.rollout.engines.choice import check_engine_settings, resolve_engine
from search_rl.rollout.tools import check_tool_specs

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
    if isinstance(cfg, PPOConfig | SFTConfig):
        device = cfg.trainer.device
        gpu = device == "cuda" or device == "auto" and _cuda()
        # with auto, the engines run on the GPUs the Ray cluster has: only a local cluster is known to be this machine
        on_cpu = device == "cpu" or device == "auto" and not gpu and cfg.trainer.ray_address is None
        rollout = cfg.actor_rollout_ref.rollout
        check_engine_settings(rollout, on_cpu, resolve_engine(rollout, cfg.model.path, gpu))
        check_rollout_tools(rollout, getattr(cfg, "retriever", None))
        # the workers run on this machine unless they join a running cluster, whose nodes' CPUs and GPUs are unknown
        here = not cfg.trainer.use_ray or cfg.trainer.ray_address is None
        resolve_dtype(cfg.model, ("cuda" if gpu else "cpu") if here else None)
    if isinstance(cfg, PPOConfig):
        fill_estimator_defaults(cfg)
    if isinstance(cfg, EvalConfig):
        gpu = _cuda()  # evaluation's engine runs in this process
        check_engine_settings(cfg.rollout, not gpu, resolve_engine(cfg.rollout, cfg.model.path, gpu))
        check_rollout_tools(cfg.rollout, getattr(cfg, "retriever", None))
        resolve_dtype(cfg.model, "cuda" if gpu else "cpu")
    return cfg


def check_rollout_tools(rollout: RolloutConfig, retriever: Any) -> None:
    """Import and build each tool of ``rollout.tools`` once (``rollout.tools.check_tool_specs``), before Ray starts.

    Raises:
        ConfigError: an entry that cannot be built or declares itself wrongly, or ``open`` without the retriever
            service; the message names the entry.
    """
    check_tool_specs(rollout.tools, getattr(retriever, "backend", None))


def resolve_dtype(model: ModelConfig, device: str | None) -> None:
    """Replace ``model.dtype=auto`` by the compute dtype of ``device`` (``search_rl.models.compute_dtype``), logging
    why, and record the reason in ``model.dtype_reason``.

    Args:
        model: the config's ``model``.
        device: where the models compute (``cpu`` or ``cuda``); None when it is not this machine (a cluster's
            nodes): ``auto`` stays, and each worker resolves it for its own device.
    """
    if device is None:
        if model.dtype == AUTO:
            logger.info("model.dtype=auto is resolved by each worker for its own device (the cluster's nodes)")
        return
    requested = model.dtype
    model.dtype, model.dtype_reason = resolve_compute_dtype(requested, device)
    if requested == AUTO:
        logger.info("model.dtype=auto -> %s (%s)", model.dtype, model.dtype_reason)


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
