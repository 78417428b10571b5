"""``build_engine``: the one place that turns ``actor_rollout_ref.rollout`` settings into a ``RolloutEngine``.

The actor workers (``workers/actor_rollout_ref.py``) and the asynchronous generators (``async_rollout/generator.py``)
both build their engine here, so an engine setting means the same thing in every mode.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import HFEngineConfig, ModelConfig, StaticEngineConfig, VLLMEngineConfig
from search_rl.models import load_model, model_dir
from search_rl.models.compute_dtype import compute_dtype_on
from search_rl.models.weights import save_hf_folder, tensor_aliases
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.choice import STATIC_PASSED_GPU_ROUND
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.static import StaticEngine

logger = logging.getLogger(__name__)

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
    export: Callable[[str], Path],
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
        export: writes the current policy as an HF folder into the given directory and returns it (vLLM loads it).
        device: where the HF or static engine runs.
        seed: the engine's seed (``seeds.engine_seed``).
        name: a label for the export folder.

    Raises:
        ValueError: ``cfg.engine`` is ``hf`` or ``static`` but no model was given, or still ``auto`` (an unresolved
            config).
    """
    if cfg.engine == "auto":
        raise ValueError("rollout.engine=auto is chosen when the config is resolved (search_rl.configure.resolve)")
    if cfg.engine == "vllm":
        from search_rl.rollout.engines.vllm import VLLMEngine

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


def static_features(static: StaticEngineConfig, gpu: bool) -> tuple[bool, bool]:
    """``(cuda_graphs, compile)`` for ``rollout.static`` on a GPU or not: each as set, and null (the default) off
    until the static engine has passed ``bench/gpu_round.py`` on a GPU (``choice.STATIC_PASSED_GPU_ROUND``), then on
    a GPU only.

    >>> static_features(StaticEngineConfig(), gpu=True), static_features(StaticEngineConfig(compile=True), gpu=True)
    ((False, False), (False, True))
    """
    default = gpu and STATIC_PASSED_GPU_ROUND
    graphs = default if static.cuda_graphs is None else static.cuda_graphs
    return graphs, default if static.compile is None else static.compile


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


def build_standalone_engine(
    cfg: EngineSettings, tokenizer: PreTrainedTokenizerBase, model: ModelConfig, policy: PreTrainedModel | None = None
) -> RolloutEngine:
    """An engine for the model ``model.path`` names, outside training (evaluation, benchmarks), on the device
    ``configure.resolve`` chose ``cfg.engine`` for (``standalone_device``). vLLM loads the model's own folder (in its
    saved dtype); the in-process engines generate with ``policy`` (loaded in ``model.dtype`` when not given, ``auto``
    resolved for that device), moved to that device."""
    device = standalone_device()
    if cfg.engine == "vllm" and model.path != "tiny":
        directory = model_dir(model.path)
        return build_engine(cfg, tokenizer, model=None, export=lambda _: directory, device=device, seed=model.seed)
    loaded = (
        policy
        if policy is not None
        else load_model(model.path, dtype=compute_dtype_on(model.dtype, device), seed=model.seed)
    )

    def export(directory: str) -> Path:
        aliases = tensor_aliases(loaded)
        return save_hf_folder(directory, loaded.state_dict(), loaded.config, aliases=aliases, tokenizer=tokenizer)

    engine = build_engine(cfg, tokenizer, model=loaded, export=export, device=device, seed=model.seed, name="eval")
    logger.info("evaluation engine: %s on %s", cfg.engine, device)
    return engine


def standalone_device() -> torch.device:
    """Where an engine outside training runs: the first GPU where CUDA is available (``configure.resolve`` chose
    ``engine=auto`` for it), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
