"""The demo's progress displays: a training stage's tqdm bar (``ProgressSink``, a ``Tracker`` sink) and the
retriever's index build while it starts (``BuildProgress``, which polls ``GET /health``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import httpx
from tqdm import tqdm

logger = logging.getLogger(__name__)


class ProgressSink:
    """A ``Tracker`` sink that drives a tqdm bar: the step, a few metrics and the ETA of the remaining steps."""

    RL_FIELDS = (("reward", "reward/score_mean"), ("em", "reward/em"), ("searches", "rollout/searches_mean"))
    SFT_FIELDS = (("nll", "sft/nll"),)

    def __init__(
        self,
        total_steps: int,
        first_step: int = 0,
        desc: str = "train",
        fields: tuple[tuple[str, str], ...] = (),
        groups: int = 0,
    ) -> None:
        self.fields = fields or self.RL_FIELDS
        self.groups = groups
        """GRPO groups per step (prompts); with it, each step prints how many had rewards that differ."""
        self.bar = tqdm(total=total_steps, initial=first_step, desc=desc, unit="step", dynamic_ncols=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if "dynamic_sampling/trained_groups" in metrics and self.groups:
            trained = round(metrics["dynamic_sampling/trained_groups"])
            batches = round(metrics["dynamic_sampling/gen_batches"])
            dropped = round(metrics["dynamic_sampling/dropped_groups"])
            tqdm.write(
                f"step {step}: {trained} of {self.groups} groups with signal trained (rewards not all equal; "
                f"{batches} generation batches, {dropped} flat groups dropped)"
            )
        elif "reward/groups_all_equal" in metrics and self.groups:
            with_signal = round(self.groups * (1.0 - metrics["reward/groups_all_equal"]))
            tqdm.write(f"step {step}: {with_signal} of {self.groups} groups with signal (rewards not all equal)")
        shown = {label: f"{metrics.get(key, float('nan')):.3f}" for label, key in self.fields}
        self.bar.set_postfix(**shown, step_s=f"{metrics.get('timing/step_s', float('nan')):.0f}")
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()


class BuildProgress:
    """While the retriever starts, polls its ``GET /health`` and shows the index build it reports: a log line per
    step and a tqdm bar for steps that count items (encoding the corpus: passages)."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.seen: list[dict[str, Any]] = []
        """Every distinct progress report read, in order."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retriever-build-progress", daemon=True)
        self._bar: tqdm | None = None
        self._stage: str | None = None

    def __enter__(self) -> BuildProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.close()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    progress = client.get(f"{self.url}/health").json().get("progress")
                except (httpx.HTTPError, ValueError):  # not listening yet, or not JSON
                    continue
                if progress and (not self.seen or progress != self.seen[-1]):
                    self.seen.append(progress)
                    self.show(progress)

    def show(self, progress: dict[str, Any]) -> None:
        """Render one report: a new step logs a line (and opens a bar if it counts items); the same step moves it."""
        stage, done, total = progress["stage"], progress["done"], progress["total"]
        if stage != self._stage:
            self._stage = stage
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            logger.info("retriever: %s (%.0fs since start)", stage, progress["elapsed_s"])
            if total > 0 and done < total:
                self._bar = tqdm(total=total, desc=stage, unit="item", dynamic_ncols=True)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
