"""Evaluation of a base model or a checkpoint on any parquet of Search-R1 rows, with the two baselines: greedy, or
``n_samples`` sampled answers per question (mean EM and pass@k: how much an RL policy could gain by sharpening).

    python -m search_rl.main_eval                                                # SmolLM2 with search, shipped test set
    python -m search_rl.main_eval model.path=runs/default/global_step_6/actor    # a trained checkpoint
    python -m search_rl.main_eval baseline=no_search                             # closed book, same model
    python -m search_rl.main_eval baseline=naive_rag rag_topk=3                  # top-3 passages inlined, no search
    python -m search_rl.main_eval 'data.files=[data/datasets/eval/bamboogle_test.parquet]' data.max_samples=50
    python -m search_rl.main_eval n_samples=8 actor_rollout_ref.rollout.temperature=1.0   # 8 samples per question

``search`` rolls out the rows' own prompts with the search loop; ``no_search`` and ``naive_rag`` rebuild the prompt
from the row's ``question`` with ``configs/templates/{no_search,naive_rag}.txt`` (``search_rl.templates``) and run one
answer turn. Same model, same greedy decoding, same scoring (``reward`` config). Writes ``metrics.json`` and
``trajectories.jsonl`` (the rollout-dump records of ``search_rl.tracking.rollout_dump``) under
``<output_dir>/<baseline>-<time>/``. The last line on stdout is ``eval n=<count> em=<x> subem=<y> f1=<z>`` over all
scored rows; per-source EM / sub-EM / F1, answer rate and searches per question are logged above it, with the search
diagnostics (``search_rl.reward.search_stats``: valid-search rate, duplicate queries, gold retrieved, wrong answers
split into no answer / no search / retrieval missed / read wrong, EM by number of searches, answer length). ``python -m
search_rl.tools.diagnose --eval <run>/metrics.json`` prints them as a table.

``metrics.json`` also holds tokens per question (``eval/<source>/model_tokens``, ``response_tokens``), the share of
answers copied from a passage shown (``answer_copy_rate``) and the run's ``fingerprint`` (``search_rl.evaluation``:
weights, template, budgets, retriever, data files, packages), which ``compare_evals`` checks (docs/evaluation.md).

With ``n_samples=k > 1`` every question is rolled out ``k`` times at ``actor_rollout_ref.rollout.temperature`` (top-p,
top-k likewise; seed ``actor_rollout_ref.rollout.seed``, 0 when unset): the EM, F1 and diagnostics are means over
all ``k`` samples, ``eval/<source>/pass@<k>`` is the share of questions with at least one exactly right, and the
result line adds ``samples=<k> pass@<k>=<x>``; ``n`` still counts questions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from search_rl.batches import PromptBatch
from search_rl.config import CONFIG_DIR, ConfigError, EvalConfig, exit_on_renamed, register_configs
from search_rl.configure import load_config, to_config
from search_rl.datatypes import Trajectory
from search_rl.evaluation.fingerprint import pin
from search_rl.evaluation.metrics import answer_evidence_metrics
from search_rl.models import dtype_of, load_model, load_tokenizer
from search_rl.prompt_data import PromptDataset, read_rows
from search_rl.reward.scoring import answer_metrics, pass_at_k_metrics, score_trajectories
from search_rl.rollout.backends import build_retriever, meter_metrics, meter_of, write_backend_manifest
from search_rl.rollout.backends.web import SearchBudgetExhausted
from search_rl.rollout.engines.factory import build_standalone_engine
from search_rl.rollout.generation_manager import LLMGenerationManager, Retriever
from search_rl.rollout.prompts import encode_prompt
from search_rl.rollout.retriever_client import RetrieverError
from search_rl.templates import load_template, render_prompt
from search_rl.tracking.rollout_dump import write_records

logger = logging.getLogger("search_rl.main_eval")


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
    """Roll out every selected row (greedily, or ``n_samples`` times), score it, write the files; see the module
    docstring. ``retriever`` replaces the configured one in the search loop (the grounding probes,
    ``search_rl.evaluation.probes``); ``metrics.json`` carries the run's fingerprint (``evaluation.fingerprint``)."""
    search = cfg.baseline == "search" and cfg.do_search and cfg.max_turns > 0
    k, greedy = cfg.n_samples, cfg.n_samples == 1
    seed = 0 if cfg.rollout.seed is None else cfg.rollout.seed
    rollout = replace(cfg.rollout, do_search=search, max_turns=cfg.max_turns if search else 0, greedy=greedy)
    if search or cfg.baseline == "naive_rag":
        build_retriever(cfg.retriever).check_reachable()
    tokenizer = load_tokenizer(cfg.model.path)
    dataset = PromptDataset(read_rows(cfg.data.files), tokenizer, 10**9, drop_overlong=False)
    questions = baseline_prompts(cfg, dataset, dataset.subset_indices(cfg.data.max_samples, cfg.data.seed), tokenizer)
    prompts = questions.repeat_interleave(k)  # a question's samples adjacent: its prompt is encoded once
    model = load_model(cfg.model.path, dtype=dtype_of(cfg.model.dtype), seed=cfg.model.seed)
    engine = build_standalone_engine(cfg.rollout, tokenizer, cfg.model, policy=model)
    searching = search or cfg.baseline == "naive_rag"
    searcher = retriever or (build_retriever(cfg.retriever) if searching else None)
    manager = LLMGenerationManager(engine, tokenizer, searcher if search else None, rollout)
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
    fingerprint = pin(cfg, model, questions.prompt_ids, searcher if search or cfg.baseline == "naive_rag" else None)
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


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base=None)
def main(composed: DictConfig) -> None:
    try:
        cfg = to_config(composed)
        result = evaluate(cfg)
    except (ConfigError, RetrieverError, FileNotFoundError, SearchBudgetExhausted) as e:
        logger.error("cannot evaluate: %s", e)
        sys.exit(2)
    logger.info("trajectories and metrics in %s", result.output_dir)
    sys.stdout.flush()
    sys.stdout.write(result.summary + "\n")  # the result line, last on stdout (scripts parse it)
    sys.stdout.flush()


register_configs()

if __name__ == "__main__":
    exit_on_renamed("eval", sys.argv[1:])
    main()
