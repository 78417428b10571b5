"""``evaluate``: roll out a model on parquet rows (greedily, or ``n_samples`` times), score the answers and write
``metrics.json`` with the run's fingerprint and ``trajectories.jsonl``; ``load_eval_config`` composes
``configs/eval.yaml``. The entry point ``python -m search_rl.main_eval`` (its docstring says what is written and
reported) and the suites and probes of this package call them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from search_rl.batches import PromptBatch
from search_rl.config import EvalConfig
from search_rl.configure import load_config
from search_rl.datatypes import Trajectory
from search_rl.evaluation.fingerprint import pin
from search_rl.evaluation.metrics import answer_evidence_metrics
from search_rl.models import load_model, load_tokenizer
from search_rl.models.compute_dtype import compute_dtype_on
from search_rl.prompt_data import PromptDataset, encode_prompt, read_rows
from search_rl.reward.scoring import answer_metrics, pass_at_k_metrics, score_trajectories
from search_rl.rollout.assembly import build_standalone_rollout
from search_rl.rollout.backends import build_retriever, meter_metrics, meter_of, write_backend_manifest
from search_rl.rollout.engines.choice import standalone_device
from search_rl.rollout.generation_manager import Retriever
from search_rl.rollout.tools import prompt_tools
from search_rl.templates import load_template, render_prompt
from search_rl.tracking.rollout_dump import write_records

logger = logging.getLogger(__name__)


def load_eval_config(overrides: list[str] | tuple[str, ...] = ()) -> EvalConfig:
    """Compose ``configs/eval.yaml`` with overrides (tests and scripts)."""
    cfg = load_config(list(overrides), config_name="eval")
    assert isinstance(cfg, EvalConfig)
    return cfg


@dataclass(frozen=True)
class EvalResult:
    """Metrics (``eval/<source>/<metric>``), the run folder, and the summary line."""

    metrics: dict[str, float]
    output_dir: Path
    summary: str


def _messages(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def baseline_prompts(cfg: EvalConfig, dataset: PromptDataset, indices: list[int], tokenizer: Any) -> PromptBatch:
    """The prompts of the chosen baseline: the rows' own (``search``), or rebuilt from the question."""
    batch = dataset.batch(indices)
    if cfg.baseline == "search":
        return batch
    if any(not q for q in batch.questions):
        raise ValueError(f"baseline={cfg.baseline} needs the rows' `question` column (docs/data.md)")
    template = load_template(cfg.baseline)
    if cfg.baseline == "no_search":
        texts = [render_prompt(template, q) for q in batch.questions]
    else:
        hits = asyncio.run(build_retriever(cfg.retriever).search(list(batch.questions), cfg.rag_topk))
        texts = [render_prompt(template, q, passages) for q, passages in zip(batch.questions, hits, strict=True)]
    ids = tuple(tuple(encode_prompt(tokenizer, _messages(t))) for t in texts)
    return batch.replace(prompt_ids=ids)


def evaluate(cfg: EvalConfig, retriever: Retriever | None = None) -> EvalResult:
    """Roll out every selected row (greedily, or ``n_samples`` times), score it, write the files (what they hold:
    ``search_rl/main_eval.py``). ``retriever`` replaces the configured one in the search loop (the grounding probes,
    ``search_rl.evaluation.probes``); ``metrics.json`` carries the run's fingerprint (``evaluation.fingerprint``)."""
    search = cfg.baseline == "search" and cfg.rollout.search_turns > 0
    k, greedy = cfg.n_samples, cfg.n_samples == 1
    seed = 0 if cfg.rollout.seed is None else cfg.rollout.seed
    rollout = replace(cfg.rollout, search_turns=cfg.rollout.search_turns if search else 0, greedy=greedy)
    if search or cfg.baseline == "naive_rag":
        build_retriever(cfg.retriever).check_reachable()
    tokenizer = load_tokenizer(cfg.model.path)
    dataset = PromptDataset(
        read_rows(cfg.data.files), tokenizer, 10**9, drop_overlong=False, tools=prompt_tools(rollout, tokenizer)
    )
    questions = baseline_prompts(cfg, dataset, dataset.subset_indices(cfg.data.max_samples, cfg.data.seed), tokenizer)
    prompts = questions.repeat_interleave(k)  # a question's samples adjacent: its prompt is encoded once
    dtype = compute_dtype_on(cfg.model.dtype, standalone_device())  # resolved by the config unless built by hand
    model = load_model(cfg.model.path, dtype=dtype, seed=cfg.model.seed)
    searching = search or cfg.baseline == "naive_rag"
    searcher = retriever or (build_retriever(cfg.retriever) if searching else None)
    built = build_standalone_rollout(
        cfg.rollout, rollout, tokenizer, cfg.model, policy=model, dtype=dtype, retriever=searcher if search else None
    )
    engine, manager = built.engine, built.manager
    trajectories: list[Trajectory] = []
    meter = meter_of(searcher)
    before = meter.totals() if meter is not None else (0, 0.0, 0)
    start = time.perf_counter()
    for n, part in enumerate(prompts.split_by_size(cfg.batch_size * k)):
        ids = [list(p) for p in part.prompt_ids]
        trajectories += manager.generate(ids, greedy=greedy, seed=None if greedy else seed + n).trajectories
        logger.info("rolled out %d/%d (%.0fs)", len(trajectories), len(prompts), time.perf_counter() - start)
    results = score_trajectories(trajectories, prompts, cfg.reward, rollout.max_response_tokens)
    metrics = answer_metrics(trajectories, results, prompts.data_sources, "eval", prompts.targets)
    metrics.update(answer_evidence_metrics(trajectories, prompts.data_sources, "eval"))
    if search and (meter := meter_of(searcher)) is not None:  # the search cost meter: calls, USD, replayed
        spent = meter_metrics(before, meter.totals(), len(trajectories))
        metrics.update({k.replace("rollout/", "eval/all/"): v for k, v in spent.items()})
    fingerprint = pin(cfg, model, engine, questions.prompt_ids, searcher if searching else None)
    if not greedy:
        metrics.update(pass_at_k_metrics(prompts.uids, results, prompts.data_sources, "eval"))
    out = Path(cfg.output_dir) / f"{cfg.baseline}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "trajectories.jsonl", prompts, trajectories, results, tokenizer, step=0, kind="eval")
    if search:
        write_backend_manifest(out / "retrieval.json", cfg.retriever, searcher)
    (out / "metrics.json").write_text(
        json.dumps(
            {"model": cfg.model.path, "baseline": cfg.baseline, "n_samples": k, **metrics, "fingerprint": fingerprint},
            indent=1,
        )
    )
    for key, value in sorted(metrics.items()):
        logger.info("%s = %.4f", key, value)
    summary = "eval n={} em={:.4f} subem={:.4f} f1={:.4f}".format(
        len(questions), metrics["eval/all/em"], metrics["eval/all/subem"], metrics["eval/all/f1"]
    )
    if not greedy:
        summary += f" samples={k} pass@{k}={metrics[f'eval/all/pass@{k}']:.4f}"
    return EvalResult(metrics, out, summary)
