"""Running the recipe's stages in process: training one (``train_stage``, through ``main_sft`` / ``main_ppo``'s
``prepare``/``train``) and evaluating one (``evaluate``), each reusing what an earlier run of the same settings left
and keeping the evaluation's per-metric lines off the console."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from search_rl.demo.overrides import eval_overrides
from search_rl.demo.progress import ProgressSink
from search_rl.demo.settings import DemoSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageRun:
    """A finished training stage: its last checkpoint and whether this invocation trained it (then what follows it
    is stale and is trained and evaluated again)."""

    checkpoint: Path
    trained: bool


def train_stage(s: DemoSettings, stage: str, overrides: list[str], steps: int, fresh: bool) -> StageRun:
    """Train one stage (``sft`` or ``rl``) through its entry point's ``prepare``/``train``, or reuse the stage's run
    when it already reached ``steps``; returns its last checkpoint."""
    from search_rl.trainer.checkpoint import CheckpointManager

    run_dir = s.stage_dir(stage)
    latest = CheckpointManager(run_dir, 1).resolve("auto")
    done = 0 if latest is None or fresh else int(latest.name.rsplit("_", 1)[-1])
    if latest is not None and done >= steps:
        logger.info("reusing %s (already trained %d steps; --fresh to train again)", latest, done)
        return StageRun(latest, trained=False)
    if fresh:  # trainer.resume=disable keeps old lines in metrics.jsonl; a fresh stage starts a clean file
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    if stage == "sft":
        from search_rl import main_sft as entry

        cfg: Any = entry.load_sft_config(overrides)
        fields: tuple[tuple[str, str], ...] = ProgressSink.SFT_FIELDS
        groups = 0
    else:
        from search_rl import main_ppo as entry  # type: ignore[no-redef]
        from search_rl.configure import load_config

        cfg = load_config(overrides)
        fields, groups = ProgressSink.RL_FIELDS, cfg.data.train_batch_size
    logger.info("%s: python -m %s %s", stage, entry.__name__, " ".join(overrides))
    config_dict: dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[assignment]
    prepared = entry.prepare(cfg, config_dict)
    prepared.tracker.sinks.append(ProgressSink(steps, done, desc=stage, fields=fields, groups=groups))
    entry.train(cfg, prepared)
    latest = CheckpointManager(run_dir, 1).resolve("auto")
    if latest is None:
        raise RuntimeError(f"{stage} finished but left no checkpoint in {run_dir}")
    return StageRun(latest, trained=True)


def find_eval(s: DemoSettings, stage: str, model: str, dtype: str) -> Path | None:
    """An earlier evaluation of the same model on as many questions in the same compute dtype, if any (its run
    folder)."""
    for metrics_path in sorted((s.run_dir / "eval" / stage).glob("search-*/metrics.json"), reverse=True):
        m = json.loads(metrics_path.read_text())
        same_dtype = m.get("fingerprint", {}).get("engine", {}).get("dtype") == dtype
        if m.get("model") == model and m.get("eval/all/n") == s.eval_samples and same_dtype:
            return metrics_path.parent
    return None


METRIC_LINE = re.compile(r"^eval/\S+ = ")
"""A line of ``main_eval``'s per-metric dump (``eval/all/em = 0.2000``), about 40 per evaluation."""


class MetricLinesFilter(logging.Filter):
    """Drops the evaluation's per-metric INFO lines from the console: the stage's summary line says the result, and
    every metric stays in its ``metrics.json``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not METRIC_LINE.match(record.getMessage())


@contextmanager
def without_metric_lines(name: str = "search_rl.evaluation.run") -> Iterator[None]:
    """While the block runs, the logger ``name`` logs everything but its per-metric lines."""
    log, quiet = logging.getLogger(name), MetricLinesFilter()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def evaluate(s: DemoSettings, url: str, stage: str, checkpoint: Path | None, reuse: bool) -> Path:
    """Greedy evaluation of one stage's policy with search (``checkpoint`` None: the base model); returns the output
    folder. ``reuse``: an earlier evaluation of the same model on as many questions in the same dtype is kept."""
    from search_rl.evaluation.run import evaluate as run_eval
    from search_rl.evaluation.run import load_eval_config

    overrides = eval_overrides(s, url, stage, checkpoint)
    cfg = load_eval_config(overrides)
    previous = find_eval(s, stage, str(cfg.model.path), cfg.model.dtype) if reuse else None
    if previous is not None:
        logger.info("reusing the %s evaluation in %s (--fresh to train and evaluate again)", stage, previous)
        return previous
    logger.info("evaluating %s: python -m search_rl.main_eval %s", stage, " ".join(overrides))
    with without_metric_lines():
        result = run_eval(cfg)
    logger.info("%s: %s", stage, result.summary)
    return result.output_dir
