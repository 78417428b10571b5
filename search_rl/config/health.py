"""``trainer.health.*``: thresholds of the early warnings of a collapsing run (``search_rl/reward/health.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from search_rl.config.loading import ConfigError

HEALTH_SIGNALS = (
    "entropy_collapse",
    "length_blowup",
    "think_repetition",
    "search_drift",
    "turn_cap_drift",
    "answer_copy_drift",
    "flat_groups",
)
"""The warnings ``trainer.stop_on`` may name (docs/evaluation.md#early-warnings-during-training)."""


@dataclass
class HealthConfig:
    """When a warning fires. Every signal is the mean over the last ``window_steps`` steps; drifts are measured from
    the mean of the first ``baseline_steps`` steps and are only checked once those steps are past."""

    enabled: bool = True
    """Compute the signals and warn (off: no ``health/*`` metrics, ``trainer.stop_on`` must be empty)."""
    window_steps: int = 3
    """Steps averaged for each signal (small batches make one step's value noisy)."""
    baseline_steps: int = 3
    """The first steps of the run (or of the resumed run) whose mean is the reference of the drift signals."""
    entropy_floor: float = 0.05
    """``entropy_collapse``: the policy's mean token entropy (``actor/entropy``, nats) fell below this ..."""
    entropy_drop_ratio: float = 0.25
    """... or below this share of its baseline."""
    length_growth_ratio: float = 2.0
    """``length_blowup``: the mean response length (``rollout/response_tokens_mean``) grew past this multiple of its
    baseline."""
    think_repetition_max: float = 0.5
    """``think_repetition``: share of ``<think>`` word 4-grams that repeat an earlier one of the same response
    (``health/think_repetition``) above this."""
    search_drift_max: float = 1.0
    """``search_drift``: searches per trajectory (``rollout/searches_mean``) moved more than this from baseline."""
    turn_cap_drift_max: float = 0.3
    """``turn_cap_drift``: the share of trajectories stopped by the turn cap (``rollout/stop_max_turns``) rose more
    than this above its baseline."""
    answer_copy_drift_max: float = 0.3
    """``answer_copy_drift``: the share of answers copied verbatim from a retrieved passage
    (``health/answer_copy_rate``) moved more than this from its baseline."""
    flat_groups_max: float = 0.9
    """``flat_groups``: share of GRPO groups whose rewards are all equal (``reward/groups_all_equal``) above this."""

    def __post_init__(self) -> None:
        if self.window_steps < 1 or self.baseline_steps < 1:
            raise ConfigError(
                "trainer.health.window_steps and baseline_steps must be >= 1, got "
                f"{self.window_steps}, {self.baseline_steps}"
            )
        if not 0 < self.entropy_drop_ratio < 1 or self.length_growth_ratio <= 1:
            raise ConfigError(
                f"trainer.health.entropy_drop_ratio must be in (0, 1) (got {self.entropy_drop_ratio}) and "
                f"length_growth_ratio > 1 (got {self.length_growth_ratio})"
            )


def check_stop_on(stop_on: list[str], health: HealthConfig) -> None:
    """``trainer.stop_on`` names known signals, and only when the signals are computed.

    Raises:
        ConfigError: an unknown name (the valid ones listed), or names with ``trainer.health.enabled=false``.
    """
    unknown = [s for s in stop_on if s not in HEALTH_SIGNALS]
    if unknown:
        raise ConfigError(f"trainer.stop_on has unknown warnings {unknown}; choose from {HEALTH_SIGNALS}")
    if stop_on and not health.enabled:
        raise ConfigError(f"trainer.stop_on={stop_on} needs trainer.health.enabled=true")
