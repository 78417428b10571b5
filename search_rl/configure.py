"""A run's configuration, ready to use: composed with Hydra, typed (``search_rl/config/``), then resolved.

Resolution is the one place where names in the config are checked against the registries (advantage estimators,
policy losses, KL estimators, loss aggregations, reward functions) and where the defaults that depend on them are
filled (``rollout.engine=auto`` from whether vLLM is installed and runs the model, ``model.dtype=auto`` from the
device and what it computes fast (``search_rl.models.compute_dtype``), ``rollout.n`` and
``critic.enable`` from what the estimator needs, ``algorithm.tis_cap`` from whether the sampler is the trainer). It
runs before Ray starts, so a wrong name fails in a second with the key named. The config dataclasses themselves hold
data and range checks only, and never import the registries.

Once the engine and the device are known, a rollout setting that cannot apply where it runs is never dropped
silently (``check_engine_settings``): it is refused with a ``ConfigError`` when the user named both it and the engine,
and warned about once when ``engine=auto`` made the choice or the setting only partly applies.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from search_rl.algorithms import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, estimator_needs
from search_rl.config import (
    AlgorithmConfig,
    ConfigError,
    EngineRolloutConfig,
    EvalConfig,
    HFEngineConfig,
    ModelConfig,
    PPOConfig,
    RewardConfig,
    SFTConfig,
    StaticEngineConfig,
    VLLMEngineConfig,
)
from search_rl.config.loading import compose_config, to_typed
from search_rl.config.ppo import DEFAULT_GROUP_SIZE, DEFAULT_TIS_CAP
from search_rl.models.compute_dtype import AUTO, resolve_compute_dtype
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
    if isinstance(cfg, PPOConfig | SFTConfig):
        device = cfg.trainer.device
        gpu = device == "cuda" or device == "auto" and _cuda()
        # with auto, the engines run on the GPUs the Ray cluster has: only a local cluster is known to be this machine
        on_cpu = device == "cpu" or device == "auto" and not gpu and cfg.trainer.ray_address is None
        rollout = cfg.actor_rollout_ref.rollout
        check_engine_settings(rollout, on_cpu, resolve_engine(rollout, cfg.model.path, gpu))
        # the workers run on this machine unless they join a running cluster, whose nodes' CPUs and GPUs are unknown
        here = not cfg.trainer.use_ray or cfg.trainer.ray_address is None
        resolve_dtype(cfg.model, ("cuda" if gpu else "cpu") if here else None)
    if isinstance(cfg, PPOConfig):
        fill_estimator_defaults(cfg)
    if isinstance(cfg, EvalConfig):
        gpu = _cuda()  # evaluation's engine runs in this process
        check_engine_settings(cfg.rollout, not gpu, resolve_engine(cfg.rollout, cfg.model.path, gpu))
        resolve_dtype(cfg.model, "cuda" if gpu else "cpu")
    return cfg


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


def resolve_engine(rollout: EngineRolloutConfig, model_path: str, gpu: bool) -> str:
    """Replace ``rollout.engine=auto`` by a named engine (``search_rl.rollout.engines.choice``), logging why.

    Returns:
        Why ``auto`` chose that engine; empty when the config named the engine itself.
    """
    if rollout.engine != "auto":
        return ""
    rollout.engine, why = choose_engine(model_path, gpu)
    where = "a GPU" if gpu else "CPU"
    logger.info("actor_rollout_ref.rollout.engine=auto -> %s, for an engine on %s (%s)", rollout.engine, where, why)
    return why


_warned: set[str] = set()
"""Warnings already logged by this process (each is logged once, however often a config is resolved)."""


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it."""
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def check_engine_settings(rollout: EngineRolloutConfig, on_cpu: bool, auto_why: str = "") -> None:
    """Refuse or warn about rollout settings that cannot apply to the resolved engine on its device.

    Args:
        rollout: ``actor_rollout_ref.rollout`` with its engine resolved (not ``auto``).
        on_cpu: the engine is known to run on CPU (false: on CUDA, or on a cluster's devices not known here).
        auto_why: why ``engine=auto`` chose the engine; empty when the user named it.

    Raises:
        ConfigError: a setting the engine cannot run here, with the keys, why and how to fix it.
    """
    key, engine = "actor_rollout_ref.rollout", rollout.engine
    if rollout.schedule == "continuous" and engine != "hf":
        why = f"rollouts run in turns: the continuous schedule needs the hf engine's decode sessions, {engine} has none"
        if not auto_why:
            raise ConfigError(
                f"{key}.schedule=continuous with {key}.engine={engine}: {why}; set {key}.engine=hf to run continuous, "
                f"or {key}.schedule=turns"
            )
        warn_once(
            f"{key}.schedule=continuous: {why} ({key}.engine=auto chose {engine}: {auto_why}); set {key}.engine=hf "
            f"to run continuous, or {key}.schedule=turns to keep turns without this warning"
        )
    if engine == "vllm" and on_cpu:
        _check_vllm_on_cpu(rollout.vllm)
    if engine == "static" and on_cpu:
        _check_static_on_cpu(rollout.static)
    if engine != "static":
        names = tuple(f.name for f in dataclasses.fields(StaticEngineConfig))
        _warn_unused(f"{key}.static", rollout.static, StaticEngineConfig(), names, engine, auto_why)
    if engine == "vllm":  # hf.max_model_len is vLLM's context length too
        _warn_unused(f"{key}.hf", rollout.hf, HFEngineConfig(), ("max_batch_size", "prefix_cache"), engine, auto_why)
    else:
        names = tuple(f.name for f in dataclasses.fields(VLLMEngineConfig))
        _warn_unused(f"{key}.vllm", rollout.vllm, VLLMEngineConfig(), names, engine, auto_why)


def _check_static_on_cpu(static: StaticEngineConfig) -> None:
    """The static engine's GPU settings, asked for on a CPU: refused (``null``, their default, is off until the engine
    has passed the GPU round, then on a GPU only: ``factory.static_features``)."""
    key = "actor_rollout_ref.rollout.static"
    for name, why in (
        ("cuda_graphs", "CUDA graphs need a GPU"),
        ("compile", "the compiled kernels were measured no faster than eager on CPU"),
    ):
        if getattr(static, name):
            raise ConfigError(
                f"{key}.{name}=true, and this run's static engine is on CPU ({why}); set {key}.{name}=false (or "
                "null, the default: off on a CPU)"
            )


def _check_vllm_on_cpu(vllm: VLLMEngineConfig) -> None:
    """The vLLM settings that need CUDA: refused (sleep mode, CUDA IPC) or warned about (CUDA graphs)."""
    key = "actor_rollout_ref.rollout.vllm"
    if vllm.sleep_level:
        raise ConfigError(
            f"{key}.sleep_level={vllm.sleep_level} needs a GPU (vLLM's sleep mode frees CUDA memory), and this run's "
            f"vLLM engine is on CPU; set {key}.sleep_level=0"
        )
    if vllm.weight_sync == "ipc":
        raise ConfigError(
            f"{key}.weight_sync=ipc sends CUDA IPC handles, and this run's vLLM engine is on CPU; set "
            f"{key}.weight_sync=disk (or auto)"
        )
    if not vllm.enforce_eager:
        warn_once(
            f"{key}.enforce_eager=false on CPU: there are no CUDA graphs to capture; what vLLM's CPU backend does "
            f"instead is its own choice. {key}.enforce_eager=true (the default) silences this"
        )


def _warn_unused(key: str, settings: Any, defaults: Any, names: Sequence[str], engine: str, auto_why: str) -> None:
    """Warn once when ``names`` of ``settings``, which the running engine does not read, differ from their defaults."""
    changed = [f"{key}.{n}={getattr(settings, n)}" for n in names if getattr(settings, n) != getattr(defaults, n)]
    if changed:
        chose = f" (engine=auto chose it: {auto_why})" if auto_why else ""
        warn_once(f"{', '.join(changed)} do not apply: the rollout runs the {engine} engine{chose}")


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
