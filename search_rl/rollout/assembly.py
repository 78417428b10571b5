"""``build_rollout``: the one place an engine, a search backend and the search loop are put together.

Every caller that rolls out gets its ``Rollout`` here: the actor workers (``workers/actor_rollout_ref.py``), the
asynchronous generators (``async_rollout/generator.py``), evaluation (``evaluation/run.py``, through
``build_standalone_rollout``) and the benches. In order:

1. the engine's model copy is cast to the compute dtype, which the caller resolved once for its process
   (``models.compute_dtype.compute_dtype_on``) and passes down;
2. the engine is built on the caller's device by the one engine builder (``engines.factory.build_engine``; which
   engine ``auto`` means was decided when the config was resolved, ``engines.choice``);
3. the search backend is built from its config when the loop searches (``backends.build_retriever``), or taken as
   given (evaluation's grounding probes wrap the real one);
4. the search loop (``LLMGenerationManager``) checks its budgets against the engine's context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import ModelConfig, RetrieverClientConfig, RolloutConfig
from search_rl.models import model_dir
from search_rl.models.weights import save_hf_folder, tensor_aliases
from search_rl.rollout.backends import build_retriever
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.choice import standalone_device
from search_rl.rollout.engines.factory import EngineSettings, build_engine
from search_rl.rollout.generation_manager import LLMGenerationManager, Retriever

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollout:
    """An engine and the search loop that generates with it."""

    engine: RolloutEngine
    """Generates; the trainer's weights are loaded into it by version (``update_weights``)."""
    manager: LLMGenerationManager
    """The multi-turn search loop over ``engine`` and the search backend."""


def build_rollout(
    engine_cfg: EngineSettings,
    loop: RolloutConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model: PreTrainedModel | None,
    dtype: torch.dtype,
    device: torch.device,
    export: Callable[[str], Path] | None,
    seed: int,
    retriever: Retriever | RetrieverClientConfig | None,
    name: str = "policy",
) -> Rollout:
    """The engine ``engine_cfg.engine`` names on ``device``, and the search loop ``loop`` over it.

    Args:
        engine_cfg: the engine settings (``actor_rollout_ref.rollout``: ``engine``, ``hf``, ``static``, ``vllm``).
        loop: the search loop's narrow config (turns, budgets, sampling, failure policy).
        tokenizer: the policy's tokenizer.
        model: the engine's own full copy of the policy, cast to ``dtype`` and moved to ``device`` in place (the
            in-process engines generate with it); None when the engine loads an export (vLLM).
        dtype: the compute dtype, resolved once by the caller for its process.
        device: where an in-process engine runs.
        export: writes the current policy as an HF folder into the given directory and returns it (vLLM loads it);
            None where the engine is in-process.
        seed: the engine's seed (``seeds.engine_seed``).
        retriever: the search backend, or its config (built only when ``loop.search_turns > 0``); None: no search.
        name: a label for the export folder.

    Raises:
        ValueError: the engine cannot be built from these (``build_engine``), or the loop searches without a
            backend or its budgets do not fit the engine's context (``LLMGenerationManager``).
    """
    if model is not None:
        torch.nn.Module.to(model, dtype=dtype)  # in place; transformers' typed wrapper confuses mypy
    engine = build_engine(engine_cfg, tokenizer, model=model, export=export, device=device, seed=seed, name=name)
    if isinstance(retriever, RetrieverClientConfig):
        retriever = build_retriever(retriever) if loop.search_turns > 0 else None
    return Rollout(engine, LLMGenerationManager(engine, tokenizer, retriever, loop))


def build_standalone_rollout(
    engine_cfg: EngineSettings,
    loop: RolloutConfig,
    tokenizer: PreTrainedTokenizerBase,
    model_cfg: ModelConfig,
    *,
    policy: PreTrainedModel,
    dtype: torch.dtype,
    retriever: Retriever | None,
) -> Rollout:
    """A rollout of the model ``model_cfg.path`` names outside training (evaluation), on the device
    ``configure.resolve`` chose ``engine_cfg.engine`` for (``choice.standalone_device``).

    vLLM loads the model's own folder (in its saved dtype; the built-in ``tiny`` has none, so it gets an export of
    ``policy``); the in-process engines generate with ``policy`` (loaded in ``dtype``), moved to that device.
    """
    device = standalone_device()
    own_folder = engine_cfg.engine == "vllm" and model_cfg.path != "tiny"

    def export(directory: str) -> Path:
        if own_folder:
            return model_dir(model_cfg.path)
        aliases = tensor_aliases(policy)
        return save_hf_folder(directory, policy.state_dict(), policy.config, aliases=aliases, tokenizer=tokenizer)

    rollout = build_rollout(
        engine_cfg,
        loop,
        tokenizer,
        model=None if own_folder else policy,
        dtype=dtype,
        device=device,
        export=export,
        seed=model_cfg.seed,
        retriever=retriever,
        name="eval",
    )
    logger.info("evaluation engine: %s on %s", engine_cfg.engine, device)
    return rollout
