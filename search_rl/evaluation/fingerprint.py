"""The fingerprint of an evaluation: everything that decides its numbers besides the policy's luck.

``main_eval`` writes it into ``metrics.json`` (key ``fingerprint``), and ``compare_evals`` refuses to put two results
with different fingerprints in one table unless the differences are named as intended. Sections:

- ``model``: the weights' sha256 (over the loaded tensors, so a GGUF, a checkpoint and the ``tiny`` model are
  hashed alike) and the source path;
- ``engine``: the rollout engine that generated (``hf``, ``static`` or ``vllm``: what ``engine=auto`` resolved to),
  the dtype it really ran in (``dtype``: the HF model's parameters, in ``model.dtype`` with ``auto`` resolved for this
  machine; the dtype vLLM reports it loaded, the folder's own), why (``dtype_reason``: recorded, never compared; the
  dtype is) and the settings of that engine that change how sequences are batched and computed
  (``hf.max_batch_size`` and ``hf.prefix_cache`` for ``hf``/``static``; ``vllm.*`` eager mode, tensor parallelism,
  KV cache and the GPU share for ``vllm``); for ``static``, whether it was built with captured decode steps and
  compiled kernels (``static.cuda_graphs``, ``static.compile``: ``rollout.static.*`` as resolved for its device; both
  change bf16 rounding, hence seeded samples) and how many calls fell back from them (``static.fallbacks``);
- ``template``: the baseline, the template file's sha256 (``no_search``/``naive_rag``) and the sha256 of every
  evaluated prompt's token ids (the ``search`` baseline's prompt is baked into the rows);
- ``budgets``: turns, token budgets, decoding (greedy, or ``n_samples`` at a temperature);
- ``rollout``: how the rollout was run, which changes seeded samples (and greedy ones where a near tie meets
  different batching): the schedule that ran (``turns``, or ``continuous`` where the engine could run it), questions
  per call (``batch_size``: a call's samples draw from its own seed), the query and failure policies;
- ``retriever``: what the retriever's ``GET /health`` reports (method, documents, corpus sha256, index key, which
  changes with the index's content and build settings, the query-time ``search_settings`` such as nprobe, encoder)
  plus top-k, or the dict a search backend describes itself with; ``unpinned`` with the reason when it said nothing;
- ``data``: sha256 of every dataset file, the subset size and seed;
- ``reward``: the scoring settings;
- ``packages``: versions of python, torch, transformers, search-rl (and vllm when installed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import torch

from retriever_server.passages import file_sha256
from search_rl.config import EvalConfig
from search_rl.models.identity import weights_sha256
from search_rl.prompt_data import resolve_data_path
from search_rl.rollout.backends.http import identity_facts
from search_rl.rollout.engines.choice import schedule_that_runs

logger = logging.getLogger(__name__)

PACKAGES = ("search-rl", "torch", "transformers", "vllm")
"""Distributions whose versions are pinned (absent ones are left out)."""

EvalFingerprint = dict[str, dict[str, Any]]


def prompts_sha256(prompt_ids: Iterable[Sequence[int]]) -> str:
    """sha256 of the evaluated prompts' token ids (template, tokenizer and questions at once).

    >>> prompts_sha256([[1, 2], [3]]) == prompts_sha256([[1, 2], [3]]) != prompts_sha256([[1], [2, 3]])
    True
    """
    h = hashlib.sha256()
    for ids in prompt_ids:
        h.update((",".join(map(str, ids)) + "\n").encode())
    return h.hexdigest()


def retriever_health(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The retriever's description from ``GET {url}/health`` (its ``IDENTITY_FIELDS``, as ``HttpBackend`` pins them).

    Raises:
        ValueError: the retriever did not answer 200 with a JSON object (so the result cannot be pinned).
    """
    try:
        resp = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s, trust_env=False)
        body = resp.json()
    except (httpx.HTTPError, ValueError) as e:
        raise ValueError(f"retriever {url}/health gave no description to pin the evaluation on: {e}") from e
    if resp.status_code != 200 or not isinstance(body, dict):
        raise ValueError(f"retriever {url}/health answered {resp.status_code} {resp.text[:200]}: not ready")
    return identity_facts(body)


ENGINE_NAMES = {"HFEngine": "hf", "StaticEngine": "static", "VLLMEngine": "vllm"}
"""``actor_rollout_ref.rollout.engine`` names of the engine classes (what ``engine=auto`` resolved to)."""


def dtype_reason(cfg: EvalConfig, ran_in: str | None) -> str:
    """Why the engine ran in ``ran_in``: the config's resolved ``model.dtype`` and its reason, or, where the engine
    loaded the weights in another dtype (vLLM reads a model folder in its saved dtype), that ``model.dtype`` did not
    apply."""
    model = cfg.model
    why = model.dtype_reason or f"model.dtype={model.dtype}"
    if ran_in is None or ran_in == model.dtype:
        return why
    return f"the engine loaded the weights in their saved dtype; model.dtype={model.dtype} ({why}) did not apply"


def engine_identity(engine: object) -> dict[str, Any]:
    """The rollout engine that generated and the dtype it really ran in: the dtype vLLM reports it loaded (the model
    folder's own, whatever ``model.dtype`` says), else the dtype of the engine's model's parameters; for the static
    engine, what it was built with (``static_identity``)."""
    dtype = getattr(engine, "dtype", None)
    model = getattr(engine, "model", None)
    if dtype is None and isinstance(model, torch.nn.Module):
        dtype = next(model.parameters()).dtype
    name = ENGINE_NAMES.get(type(engine).__name__, type(engine).__name__)
    identity: dict[str, Any] = {"name": name}
    if dtype is not None:
        identity["dtype"] = str(dtype).removeprefix("torch.")
    if name == "static":
        identity["static"] = static_identity(engine)
    return identity


def static_identity(engine: Any) -> dict[str, Any]:
    """The static engine's captured decode steps and compiled kernels as built (``rollout.static.cuda_graphs`` and
    ``compile`` resolved for its device: each changes bf16 rounding, hence seeded samples), and the calls that fell
    back from them (a result with fallbacks computed its calls both ways)."""
    return {
        "cuda_graphs": bool(engine.cuda_graphs),
        "compile": bool(engine.compiled),
        "fallbacks": int(sum(engine.fallbacks.values())),
    }


def package_versions() -> dict[str, str]:
    """Versions of python and the ``PACKAGES`` that are installed."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def dataset_hashes(files: Sequence[str]) -> dict[str, str]:
    """``{file name: sha256}`` of the dataset files (names only: the same file at another path is the same data);
    relative paths are resolved as ``main_eval`` reads them."""
    return {Path(f).name: file_sha256(resolve_data_path(f)) for f in files}


IN_PROCESS_ENGINES = ("hf", "static")
"""Engines that read ``rollout.hf`` (micro-batches, prefix reuse)."""


def rollout_settings(cfg: EvalConfig, schedule: str | None = None) -> dict[str, Any]:
    """The ``rollout`` section: how the rollout ran, whatever the engine.

    Args:
        cfg: the evaluation's config.
        schedule: the schedule that ran (``engines.choice.schedule_that_runs``); None = the configured one.
    """
    r = cfg.rollout
    return {
        "schedule": schedule or r.schedule,
        "batch_size": cfg.batch_size,
        "max_query_chars": r.max_query_chars,
        "on_retriever_error": r.on_retriever_error,
    }


def engine_settings(cfg: EvalConfig, engine: str) -> dict[str, Any]:
    """The settings of the engine named ``engine`` that change how its sequences are batched and computed (added to
    the ``engine`` section; another engine's settings are left out, it did not read them)."""
    r = cfg.rollout
    if engine in IN_PROCESS_ENGINES:
        return {"hf": {"max_batch_size": r.hf.max_batch_size, "prefix_cache": r.hf.prefix_cache}}
    if engine == "vllm":
        v = r.vllm
        vllm = {"enforce_eager": v.enforce_eager, "tensor_parallel_size": v.tensor_parallel_size}
        return {"vllm": {**vllm, "kv_cache_gib": v.kv_cache_gib}, "gpu_memory_utilization": r.gpu_memory_utilization}
    return {}


def build_fingerprint(
    cfg: EvalConfig,
    *,
    weights: str,
    prompts: str,
    data_files: Sequence[str],
    retriever: Mapping[str, Any] | None,
    engine: Mapping[str, Any],
    template_file: Path | None = None,
    schedule: str | None = None,
) -> EvalFingerprint:
    """The fingerprint of one evaluation (sections in the module docstring).

    Args:
        cfg: the evaluation's config.
        weights: ``weights_sha256`` of the loaded model.
        prompts: ``prompts_sha256`` of the evaluated prompts.
        data_files: the resolved dataset files.
        retriever: the backend's description (``retriever_health`` or a backend's own fingerprint), None when the
            evaluation does not search; ``topk`` is added here.
        engine: ``engine_identity`` of the engine that generated.
        template_file: the baseline's template file, if it has one.
        schedule: the rollout schedule that ran; None = the configured one.
    """
    r = cfg.rollout
    sampled = cfg.n_samples > 1
    budgets: dict[str, Any] = {
        "max_turns": r.search_turns,  # the search turns, under the key earlier results carry
        "max_prompt_tokens": r.max_prompt_tokens,
        "max_turn_tokens": r.max_turn_tokens,
        "max_obs_tokens": r.max_obs_tokens,
        "max_response_tokens": r.max_response_tokens,
        "n_samples": cfg.n_samples,
        "decoding": f"sampled t={r.temperature} top_p={r.top_p} top_k={r.top_k} seed={r.seed or 0}"
        if sampled
        else "greedy",
    }
    template: dict[str, Any] = {"baseline": cfg.baseline, "prompts_sha256": prompts}
    if template_file is not None:
        template["file_sha256"] = file_sha256(template_file)
    if cfg.baseline == "naive_rag":
        template["rag_topk"] = cfg.rag_topk
    fp: EvalFingerprint = {
        "model": {"weights_sha256": weights, "path": cfg.model.path},
        "engine": {**engine, **engine_settings(cfg, engine.get("name", ""))},
        "template": template,
        "budgets": budgets,
        "rollout": rollout_settings(cfg, schedule),
        "retriever": {"backend": "none"} if retriever is None else {**retriever, "topk": cfg.retriever.topk},
        "data": {
            "files": dataset_hashes(data_files),
            "max_samples": cfg.data.max_samples,
            "seed": cfg.data.seed,
        },
        "reward": asdict(cfg.reward),
        "packages": package_versions(),
    }
    return fp


def flatten(fp: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested fingerprint.

    >>> flatten({"retriever": {"topk": 3, "method": "bm25"}, "data": {"files": {"a.parquet": "ab"}}})
    {'retriever.topk': 3, 'retriever.method': 'bm25', 'data.files.a.parquet': 'ab'}
    """
    out: dict[str, Any] = {}
    for key, value in fp.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def describe_retriever(cfg: EvalConfig, retriever: object | None) -> dict[str, Any] | None:
    """What the evaluation searched: the backend's own ``fingerprint()`` dict when it has one (probe retrievers, the
    search backends), else the HTTP retriever's ``GET /health`` (``unpinned`` with the reason when it gives none);
    None when ``retriever`` is None (no search)."""
    if retriever is None:
        return None
    own = getattr(retriever, "fingerprint", None)
    backend = getattr(cfg.retriever, "backend", "http")
    try:
        if callable(own):
            return dict(own())
        return {"backend": backend, **retriever_health(cfg.retriever.urls[0])}
    except (ValueError, RuntimeError) as e:  # the rollouts are done: keep them, leave the gap visible in the result
        logger.warning("the result is not pinned to a retriever: %s", e)
        return {"backend": backend, "unpinned": str(e)}


def pin(
    cfg: EvalConfig,
    model: torch.nn.Module,
    engine: object,
    prompt_ids: Iterable[Sequence[int]],
    retriever: object | None,
) -> EvalFingerprint:
    """``build_fingerprint`` of a ``main_eval`` run: its loaded model, the engine that generated, its prompts and the
    retriever it used."""
    from search_rl.templates import TEMPLATE_DIR

    template = TEMPLATE_DIR / f"{cfg.baseline}.txt" if cfg.baseline != "search" else None
    identity = engine_identity(engine)
    return build_fingerprint(
        cfg,
        weights=weights_sha256(model),
        prompts=prompts_sha256(prompt_ids),
        data_files=cfg.data.files,
        retriever=describe_retriever(cfg, retriever),
        engine={**identity, "dtype_reason": dtype_reason(cfg, identity.get("dtype"))},
        template_file=template if template is not None and template.is_file() else None,
        schedule=schedule_that_runs(cfg.rollout.schedule, engine),
    )
