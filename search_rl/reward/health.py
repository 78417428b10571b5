"""Early warnings of a collapsing run: signals that move before the reward does.

A GRPO run that collapses (Search-R1 issues #88/#89, near step 600) shows it first in how it writes: entropy falls
to zero, responses grow to the budget, ``<think>`` repeats itself, the number of searches or the share of episodes
cut by the turn cap drifts, answers stop (or only) coming from the evidence, and every group's rewards become equal.
This module owns two parts:

- ``trajectory_health``: the signals only the trajectories hold, logged as ``health/think_repetition`` (share of
  ``<think>`` word n-grams repeating an earlier one of the same response) and ``health/answer_copy_rate`` (share of
  answered trajectories whose answer occurs verbatim, as whole normalised words, in a passage they were shown);
- ``HealthMonitor``: each step, the ``HEALTH_SIGNALS`` checked against ``trainer.health``'s thresholds over a window
  of steps; a firing signal is logged as a warning, as ``health/warn_<signal>`` = 1 and on the progress line, and stops
  the run (after a checkpoint) when ``trainer.stop_on`` names it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from search_rl.config.health import HEALTH_SIGNALS, HealthConfig
from search_rl.datatypes import Trajectory
from search_rl.reward.qa_em import extract_answer, normalize_answer

logger = logging.getLogger(__name__)

WARN_PREFIX = "health/warn_"
"""Metric key prefix of the warning flags: ``health/warn_<signal>`` is 1 at a step where the signal fired, else 0."""
REPETITION_NGRAM = 4
"""n of the repeated word n-grams of ``health/think_repetition``."""
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


def repeated_ngram_rate(words: Sequence[str], n: int) -> float:
    """Share of the word n-grams that repeat an earlier n-gram (0 when there are none).

    >>> repeated_ngram_rate("a b c a b c a b c".split(), 3)
    0.5714285714285714
    >>> repeated_ngram_rate("the cat sat on the mat".split(), 2)
    0.0
    """
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def think_words(texts: Sequence[str]) -> list[str]:
    """The words inside the ``<think>`` blocks of a response's model turns (an unclosed block runs to the turn's end).

    >>> think_words(["<think>find the year</think><search>q</search>", "<think>it is 1999"])
    ['find', 'the', 'year', 'it', 'is', '1999']
    """
    return [w for text in texts for block in _THINK.findall(text) for w in block.split()]


def answer_copied(trajectory: Trajectory) -> bool | None:
    """Whether the extracted answer occurs as whole normalised words in a passage the model was shown; None without an
    answer or without passages shown."""
    answer = extract_answer(trajectory.model_texts)
    shown = [f"{p.title} {p.text}" for call in trajectory.search_calls for p in call.passages]
    key = normalize_answer(answer) if answer is not None else ""
    if not key or not shown:
        return None
    return any(f" {key} " in f" {normalize_answer(p)} " for p in shown)


def trajectory_health(trajectories: Sequence[Trajectory], ngram: int = REPETITION_NGRAM) -> dict[str, float]:
    """``health/think_repetition`` (mean over trajectories) and ``health/answer_copy_rate`` (over trajectories that
    answered after seeing passages; absent when none did)."""
    if not trajectories:
        return {}
    reps = [repeated_ngram_rate(think_words(t.model_texts), ngram) for t in trajectories]
    metrics = {"health/think_repetition": sum(reps) / len(reps)}
    copied = [c for t in trajectories if (c := answer_copied(t)) is not None]
    if copied:
        metrics["health/answer_copy_rate"] = sum(copied) / len(copied)
    return metrics


@dataclass(frozen=True)
class Rule:
    """One warning: the metric it reads, and whether it compares the window's mean to a level or to the baseline."""

    signal: str
    key: str
    kind: str
    """``below`` / ``above`` a level, ``ratio_below`` / ``ratio_above`` the baseline times a factor, or ``drift``
    (absolute change from the baseline), ``rise`` (increase from the baseline)."""


RULES = (
    Rule("entropy_collapse", "actor/entropy", "below"),
    Rule("entropy_collapse", "actor/entropy", "ratio_below"),
    Rule("length_blowup", "rollout/response_tokens_mean", "ratio_above"),  # rollouts only: not the SFT step
    Rule("think_repetition", "health/think_repetition", "above"),
    Rule("search_drift", "rollout/searches_mean", "drift"),
    Rule("turn_cap_drift", "rollout/stop_max_turns", "rise"),
    Rule("answer_copy_drift", "health/answer_copy_rate", "drift"),
    Rule("flat_groups", "reward/groups_all_equal", "above"),
)
assert {r.signal for r in RULES} == set(HEALTH_SIGNALS)


def _limit(rule: Rule, cfg: HealthConfig) -> float:
    return {
        ("entropy_collapse", "below"): cfg.entropy_floor,
        ("entropy_collapse", "ratio_below"): cfg.entropy_drop_ratio,
        ("length_blowup", "ratio_above"): cfg.length_growth_ratio,
        ("think_repetition", "above"): cfg.think_repetition_max,
        ("search_drift", "drift"): cfg.search_drift_max,
        ("turn_cap_drift", "rise"): cfg.turn_cap_drift_max,
        ("answer_copy_drift", "drift"): cfg.answer_copy_drift_max,
        ("flat_groups", "above"): cfg.flat_groups_max,
    }[(rule.signal, rule.kind)]


@dataclass(frozen=True)
class HealthWarning:
    """A signal that fired at a step, with the numbers that made it fire."""

    signal: str
    step: int
    detail: str


class HealthMonitor:
    """Checks each step's metrics against ``trainer.health`` (module docstring); keeps the history it needs."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.history: dict[str, list[float]] = {}

    def check(self, metrics: dict[str, float], step: int) -> list[HealthWarning]:
        """Record the step's metrics, add ``health/warn_<signal>`` (1 fired, 0 not) for every signal that could be
        checked, and return the warnings that fired (each logged)."""
        for key in {r.key for r in RULES}:
            if key in metrics:
                self.history.setdefault(key, []).append(float(metrics[key]))
        fired: dict[str, str] = {}
        checked: set[str] = set()
        for rule in RULES:
            detail = self._evaluate(rule)
            if detail is None:
                continue
            checked.add(rule.signal)
            if detail and rule.signal not in fired:
                fired[rule.signal] = detail
        for signal in checked:
            metrics[f"{WARN_PREFIX}{signal}"] = float(signal in fired)
        warnings = [HealthWarning(s, step, d) for s, d in fired.items()]
        for w in warnings:
            logger.warning("health warning at step %d: %s: %s (docs/evaluation.md)", step, w.signal, w.detail)
        return warnings

    def _evaluate(self, rule: Rule) -> str | None:
        """None when the rule cannot be checked yet; "" when it holds; else why it fired."""
        values, cfg = self.history.get(rule.key, []), self.cfg
        if len(values) < cfg.window_steps:
            return None
        window = sum(values[-cfg.window_steps :]) / cfg.window_steps
        limit = _limit(rule, cfg)
        if rule.kind in ("below", "above"):
            bad = window < limit if rule.kind == "below" else window > limit
            return f"{rule.key} {window:.4g} (mean of {cfg.window_steps} steps) {rule.kind} {limit:g}" if bad else ""
        if len(values) < cfg.baseline_steps + cfg.window_steps:
            return None  # drift: only once the window has left the baseline steps
        base = sum(values[: cfg.baseline_steps]) / cfg.baseline_steps
        if rule.kind == "ratio_below":
            bad = window < limit * base
        elif rule.kind == "ratio_above":
            bad = window > limit * base
        elif rule.kind == "drift":
            bad = abs(window - base) > limit
        else:
            bad = window - base > limit
        return f"{rule.key} {window:.4g} against a baseline of {base:.4g} ({rule.kind} {limit:g})" if bad else ""


def replay(records: Sequence[dict[str, float]], cfg: HealthConfig) -> list[HealthWarning]:
    """The warnings a finished run's ``metrics.jsonl`` records (each with its ``step``) would have raised, for runs
    made before the monitor or with other thresholds."""
    monitor = HealthMonitor(cfg)
    found: list[HealthWarning] = []
    for record in records:
        metrics = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        found += monitor.check(metrics, int(record["step"]))
    return found
