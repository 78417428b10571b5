"""Every configuration of search-rl, in one package: plain dataclasses mirrored by ``configs/*.yaml``.

One layout per concept, the same key path for the same setting in every entry point:

- ``model.py``: ``model.*`` (what to train or evaluate) and ``OptimConfig``.
- ``rollout.py``: the search loop ``actor_rollout_ref.rollout.*`` and its engine (``EngineRolloutConfig``:
  ``engine``, ``...rollout.hf.*``, ``...rollout.vllm.*``, the same in training and evaluation).
- ``search_backends.py``: ``retriever.*``, how the rollout searches (``RetrieverClientConfig``) and every backend.
- ``roles.py``: ``actor_rollout_ref.actor.*``, ``actor_rollout_ref.ref.*``, ``critic.*``.
- ``algorithm.py``: ``algorithm.*``, the RL objective.
- ``run.py``: ``data.*``, ``reward.*``, ``trainer.*``, and ``StepSettings`` (what one step needs from them).
- ``ppo.py``, ``sft.py``, ``eval.py``: the roots of ``ppo_trainer.yaml``, ``sft_trainer.yaml``, ``eval.yaml``.
- ``loading.py``: composing with Hydra, unknown and moved keys (``search_rl.configure`` adds the registry checks),
  and ``ConfigError``, which every check raises.

Components receive the narrow config they need (``RolloutConfig``, not the root).
"""

from search_rl.config.algorithm import KL_CTRL_TYPES, AlgorithmConfig
from search_rl.config.eval import BASELINES, EvalActorRolloutRefConfig, EvalConfig, EvalDataConfig, EvalRolloutConfig
from search_rl.config.loading import (
    CONFIG_DIR,
    RENAMED,
    ConfigError,
    check_renamed,
    compose_config,
    exit_on_renamed,
    register_configs,
    to_typed,
    unknown_keys,
)
from search_rl.config.model import DTYPES, ModelConfig, OptimConfig, check_trainable_dtype
from search_rl.config.ppo import DEFAULT_GROUP_SIZE, PPOConfig
from search_rl.config.roles import ActorConfig, ActorRolloutRefConfig, CriticConfig, RefConfig
from search_rl.config.rollout import (
    ENGINES,
    EngineRolloutConfig,
    HFEngineConfig,
    RolloutConfig,
    StaticEngineConfig,
    TrainRolloutConfig,
    VLLMEngineConfig,
)
from search_rl.config.run import DEVICES, LOGGERS, DataConfig, RewardConfig, StepSettings, TrainerConfig
from search_rl.config.search_backends import RetrieverClientConfig
from search_rl.config.sft import SFT_TRAIN_FILE, SFTActorConfig, SFTConfig, SFTRolloutConfig

__all__ = [
    "BASELINES",
    "CONFIG_DIR",
    "DEFAULT_GROUP_SIZE",
    "DEVICES",
    "DTYPES",
    "ENGINES",
    "KL_CTRL_TYPES",
    "LOGGERS",
    "RENAMED",
    "SFT_TRAIN_FILE",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EvalActorRolloutRefConfig",
    "EvalConfig",
    "EvalDataConfig",
    "EngineRolloutConfig",
    "EvalRolloutConfig",
    "HFEngineConfig",
    "StaticEngineConfig",
    "VLLMEngineConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOConfig",
    "RefConfig",
    "RetrieverClientConfig",
    "RewardConfig",
    "RolloutConfig",
    "SFTActorConfig",
    "SFTConfig",
    "SFTRolloutConfig",
    "StepSettings",
    "TrainRolloutConfig",
    "TrainerConfig",
    "check_renamed",
    "check_trainable_dtype",
    "exit_on_renamed",
    "compose_config",
    "register_configs",
    "to_typed",
    "unknown_keys",
]
