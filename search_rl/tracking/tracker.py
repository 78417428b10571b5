"""``Tracker.log(metrics, step)``: one call fans out to the configured sinks (``trainer.logger``).

- ``console``: one compact line per step (reward, EM, KL, entropy, phase times) through ``logging``.
- ``jsonl``: ``metrics.jsonl`` in the run folder, one ``{"step": n, ...}`` object per line. On resume the lines of
  steps after the checkpoint are dropped, so the file reads as one uninterrupted run (a line cut off by a crash is
  dropped too, with a warning).
- ``tensorboard``: event files under ``tensorboard/`` (skipped with a warning when tensorboard is not installed).
- ``wandb``: only when asked for; it must be installed.

Metric keys are namespaced (``reward/em``, ``actor/kl_loss``, ``timing/rollout_s``); ``timer`` measures a phase.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from search_rl.tracking.jsonl import jsonl_lines

logger = logging.getLogger(__name__)

WARN_PREFIX = "health/warn_"
"""Health warning flags (``search_rl/reward/health.py``): a step whose flag is 1 shows ``WARNING <signal>``."""

CONSOLE_KEYS = (
    ("reward", "reward/score_mean"),
    ("em", "reward/em"),
    ("no_signal", "reward/groups_all_equal"),
    ("val_em", "val/all/em"),
    ("nll", "sft/nll"),
    ("epoch", "train/epoch"),
    ("searches", "rollout/searches_mean"),
    ("resp_len", "response_length/mean"),
    ("kl", "actor/kl"),
    ("ppo_kl", "actor/ppo_kl"),
    ("entropy", "actor/entropy"),
    ("clipfrac", "actor/clipfrac"),
    ("vf_loss", "critic/vf_loss"),
    ("rollout_s", "timing/rollout_s"),
    ("update_s", "timing/update_actor_s"),
    ("step_s", "timing/step_s"),
)
"""What the console line shows, as (label, metric key)."""


@contextmanager
def timer(name: str, metrics: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to ``metrics["timing/<name>_s"]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"timing/{name}_s"] = metrics.get(f"timing/{name}_s", 0.0) + time.perf_counter() - start


class Sink(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class ConsoleSink:
    """One line per step through the ``search_rl.progress`` logger."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.log_ = logging.getLogger("search_rl.progress")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        parts = [f"step {step}/{self.total_steps}"]
        parts += [f"{label} {metrics[key]:.4g}" for label, key in CONSOLE_KEYS if key in metrics]
        warned = sorted(k.removeprefix(WARN_PREFIX) for k, v in metrics.items() if k.startswith(WARN_PREFIX) and v)
        parts += [f"WARNING {','.join(warned)}"] if warned else []
        self.log_.info(" | ".join(parts))

    def close(self) -> None:
        return None


class JsonlSink:
    """``metrics.jsonl``: one JSON object per step (non-finite numbers are written as null)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def rewind(self, step: int) -> None:
        """Drop the lines of steps after ``step`` (a resumed run rewrites them), and any line that is not a metrics
        record: a line cut off by a crash mid-write is dropped with a warning, not a reason to refuse the resume."""
        if not self.path.exists():
            return
        kept = []
        for number, line in jsonl_lines(self.path):
            record = _parse_record(line)
            if record is None:
                logger.warning("%s line %d is not a metrics record (cut off by a crash?); dropped", self.path, number)
                continue
            if record["step"] <= step:
                kept.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(self.path)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step}
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        return None


def _parse_record(line: str) -> dict[str, Any] | None:
    """The JSON object of a ``metrics.jsonl`` line, or None when the line is not one (torn, blank, no int step)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    return record


class TensorBoardSink:
    """Scalars under ``<run>/tensorboard``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases run (``trainer.logger`` must list ``wandb``)."""

    def __init__(self, project: str, name: str, config: Mapping[str, Any], resume_dir: Path) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, config=dict(config), dir=str(resume_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    """Fans ``log`` out to the sinks and keeps the history in memory (tests and benchmarks read it)."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.history: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items()}
        self.history.append((step, clean))
        for sink in self.sinks:
            sink.log(clean, step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` (called when a run resumes from that step)."""
        self.history = [(s, m) for s, m in self.history if s <= step]
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.rewind(step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _check_wandb() -> None:
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        raise ImportError("trainer.logger lists wandb but it is not installed: pip install wandb") from e


def build_tracker(
    names: Sequence[str], run_dir: Path, total_steps: int, project: str, experiment: str, config: Mapping[str, Any]
) -> Tracker:
    """The sinks named in ``trainer.logger``; tensorboard is skipped (with a warning) when not installed.

    Raises:
        ImportError: ``wandb`` is asked for but not installed (checked before anything starts).
    """
    sinks: list[Sink] = []
    for name in names:
        if name == "console":
            sinks.append(ConsoleSink(total_steps))
        elif name == "jsonl":
            sinks.append(JsonlSink(run_dir / "metrics.jsonl"))
        elif name == "tensorboard":
            try:
                sinks.append(TensorBoardSink(run_dir / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed (pip install tensorboard); not writing event files")
        elif name == "wandb":
            _check_wandb()
            sinks.append(WandbSink(project, experiment, config, run_dir))
        else:
            raise ValueError(f"unknown metric sink {name!r}")
    return Tracker(sinks)
