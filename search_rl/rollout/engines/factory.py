"""``build_engine``: the one place that turns ``actor_rollout_ref.rollout`` settings into a ``RolloutEngine``.

The actor workers (``workers/actor_rollout_ref.py``) and the asynchronous generators (``async_rollout/generator.py``)
both build their engine here, so an engine setting means the same thing in every mode.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import TrainRolloutConfig
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.hf import HFEngine


def build_engine(
    cfg: TrainRolloutConfig,
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
        cfg: the rollout settings (``engine``, ``hf``, vLLM's memory settings).
        tokenizer: the policy's tokenizer.
        model: the engine's own full copy of the policy (the HF engine generates with it; moved to ``device`` in
            place); None when only an engine that loads from disk is possible.
        export: writes the current policy as an HF folder into the given directory and returns it (vLLM loads it).
        device: where the HF engine runs.
        seed: the engine's seed (``seeds.engine_seed``).
        name: a label for the export folder.

    Raises:
        ValueError: ``cfg.engine`` is ``hf`` but no model was given.
    """
    if cfg.engine == "vllm":
        from search_rl.rollout.engines.vllm import VLLMEngine

        directory = export(tempfile.mkdtemp(prefix=f"search-rl-{name}-"))
        return VLLMEngine(
            str(directory),
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.hf.max_model_len,
            seed=seed,
        )
    if model is None:
        raise ValueError("build_engine: the hf engine needs the model it generates with")
    torch.nn.Module.to(model, device)  # in place
    return HFEngine(model, tokenizer, cfg.hf)
