"""``build_engine``: the one place that turns ``actor_rollout_ref.rollout`` settings into a ``RolloutEngine``.

Every rollout gets its engine here through ``rollout.assembly.build_rollout`` (the actor workers, the asynchronous
generators, evaluation, the benches), and the simulated search backend builds its writer here too, so an engine
setting means the same thing in every mode. Which engine ``auto`` means, and with which features on which device, is
decided in ``choice``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import HFEngineConfig, StaticEngineConfig, VLLMEngineConfig
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.choice import static_features
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.static import StaticEngine

MODEL_ENGINES = ("hf", "static")
"""Engines that generate with the in-process model copy handed to ``build_engine`` (the others load an export)."""


class EngineSettings(Protocol):
    """The engine keys of ``actor_rollout_ref.rollout`` (training's ``TrainRolloutConfig``, evaluation's
    ``EvalRolloutConfig``)."""

    engine: str
    hf: HFEngineConfig
    static: StaticEngineConfig
    vllm: VLLMEngineConfig
    gpu_memory_utilization: float


def build_engine(
    cfg: EngineSettings,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model: PreTrainedModel | None,
    export: Callable[[str], Path] | None,
    device: torch.device,
    seed: int,
    name: str = "policy",
) -> RolloutEngine:
    """The engine ``cfg.engine`` names.

    Args:
        cfg: the rollout settings (``engine``, ``hf``, ``vllm``, ``gpu_memory_utilization``).
        tokenizer: the policy's tokenizer.
        model: the engine's own full copy of the policy (the HF engine generates with it; moved to ``device`` in
            place); None when only an engine that loads from disk is possible.
        export: writes the current policy as an HF folder into the given directory and returns it (vLLM loads it);
            None where only an in-process engine is built.
        device: where the HF or static engine runs.
        seed: the engine's seed (``seeds.engine_seed``).
        name: a label for the export folder.

    Raises:
        ValueError: ``cfg.engine`` is ``hf`` or ``static`` but no model was given, ``vllm`` but no export, or still
            ``auto`` (an unresolved config).
    """
    if cfg.engine == "auto":
        raise ValueError("rollout.engine=auto is chosen when the config is resolved (search_rl.configure.resolve)")
    if cfg.engine == "vllm":
        from search_rl.rollout.engines.vllm import VLLMEngine

        if export is None:
            raise ValueError("build_engine: the vllm engine loads the policy from an export, and none was given")
        directory = export(tempfile.mkdtemp(prefix=f"search-rl-{name}-"))
        return VLLMEngine(
            str(directory),
            settings=cfg.vllm,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.hf.max_model_len,
            seed=seed,
        )
    if model is None:
        raise ValueError(f"build_engine: the {cfg.engine} engine needs the model it generates with")
    torch.nn.Module.to(model, device)  # in place
    if cfg.engine == "static":
        return build_static_engine(cfg.hf, cfg.static, model, tokenizer)
    return HFEngine(model, tokenizer, cfg.hf)


def build_static_engine(
    hf: HFEngineConfig, static: StaticEngineConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> StaticEngine:
    """The static engine with ``rollout.static`` resolved for the model's device (``static_features``: graphs and
    compile only where asked for, until the engine has passed the GPU round)."""
    cuda_graphs, compiled = static_features(static, model.device.type == "cuda")
    return StaticEngine(
        model,
        tokenizer,
        hf,
        cuda_graphs=cuda_graphs,
        compiled=compiled,
        readback_steps=static.readback_steps,
        free_on_sleep=static.free_on_sleep,
    )
