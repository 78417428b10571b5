"""Early warnings (``search_rl/reward/health.py``): each signal fires on a history that shows it and stays silent on
a healthy one; the trajectory signals (``<think>`` repetition, answers copied from the evidence).

Run: python -m pytest tests/search_rl/reward/test_health.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.config import ConfigError
from search_rl.config.health import HEALTH_SIGNALS, HealthConfig
from search_rl.configure import load_config
from search_rl.datatypes import Passage, SearchCall, Segment, Trajectory, TrajectoryStats
from search_rl.reward.health import WARN_PREFIX, HealthMonitor, answer_copied, trajectory_health
from search_rl.tracking import tracker

HEALTHY = {
    "actor/entropy": 0.9,
    "rollout/response_tokens_mean": 300.0,
    "health/think_repetition": 0.05,
    "rollout/searches_mean": 1.0,
    "rollout/stop_max_turns": 0.05,
    "health/answer_copy_rate": 0.6,
    "reward/groups_all_equal": 0.5,
}
"""A step of a healthy run (values of the order the demo's GRPO steps log)."""

SICK = {
    "entropy_collapse": ("actor/entropy", 0.01),
    "length_blowup": ("rollout/response_tokens_mean", 900.0),
    "think_repetition": ("health/think_repetition", 0.8),
    "search_drift": ("rollout/searches_mean", 3.0),
    "turn_cap_drift": ("rollout/stop_max_turns", 0.6),
    "answer_copy_drift": ("health/answer_copy_rate", 0.1),
    "flat_groups": ("reward/groups_all_equal", 1.0),
}
"""For each signal, the metric that shows it and a value it reaches in a collapsing run."""


def run(monitor: HealthMonitor, steps: list[dict[str, float]]) -> list[set[str]]:
    return [{w.signal for w in monitor.check(dict(m), i + 1)} for i, m in enumerate(steps)]


def test_every_signal_has_a_constructed_run():
    assert set(SICK) == set(HEALTH_SIGNALS)


def test_healthy_run_is_silent_and_flags_are_logged():
    monitor = HealthMonitor(HealthConfig())
    steps = [dict(HEALTHY) for _ in range(10)]
    assert run(monitor, steps) == [set()] * 10
    last = dict(HEALTHY)
    monitor.check(last, 11)
    assert {k for k in last if k.startswith(WARN_PREFIX)} == {WARN_PREFIX + s for s in HEALTH_SIGNALS}
    assert all(last[WARN_PREFIX + s] == 0.0 for s in HEALTH_SIGNALS)


@pytest.mark.parametrize("signal", sorted(SICK))
def test_each_signal_fires_on_a_run_that_shows_it(signal, caplog):
    key, bad = SICK[signal]
    steps = [dict(HEALTHY) for _ in range(4)] + [{**HEALTHY, key: bad} for _ in range(3)]
    fired = run(HealthMonitor(HealthConfig()), steps)
    assert fired[:4] == [set()] * 4  # healthy steps
    assert fired[6] == {signal}  # the window (3 steps) holds only bad ones: it fires, and nothing else does
    assert set().union(*fired) == {signal}
    assert f"health warning at step 7: {signal}" in caplog.text


def test_one_bad_step_does_not_fire_but_a_window_does():
    monitor = HealthMonitor(HealthConfig(window_steps=3))
    steps = [dict(HEALTHY)] * 5 + [{**HEALTHY, "actor/entropy": 0.0}] + [dict(HEALTHY)] * 2
    assert all(not f for f in run(monitor, steps))


def test_entropy_collapse_relative_to_the_start():
    # a policy starting at 2 nats that falls to 0.3 has lost 85%: above the floor, below a quarter of its start
    steps = [{**HEALTHY, "actor/entropy": 2.0}] * 3 + [{**HEALTHY, "actor/entropy": 0.3}] * 3
    assert run(HealthMonitor(HealthConfig()), steps)[-1] == {"entropy_collapse"}


def test_drift_waits_for_the_baseline():
    cfg = HealthConfig(baseline_steps=3, window_steps=1)
    steps = [{"rollout/searches_mean": v} for v in (1.0, 1.0, 3.0, 3.0)]
    assert run(HealthMonitor(cfg), steps) == [set(), set(), set(), {"search_drift"}]


def test_stop_on_names_known_signals_only():
    cfg = load_config(["trainer.stop_on=[entropy_collapse,flat_groups]", "trainer.health.flat_groups_max=0.8"])
    assert cfg.trainer.stop_on == ["entropy_collapse", "flat_groups"]
    assert cfg.trainer.health.flat_groups_max == 0.8
    with pytest.raises(ConfigError, match="unknown warnings \\['entropy'\\]"):
        load_config(["trainer.stop_on=[entropy]"])
    with pytest.raises(ConfigError, match="needs trainer.health.enabled=true"):
        load_config(["trainer.stop_on=[flat_groups]", "trainer.health.enabled=false"])


def test_progress_line_shows_the_warnings(caplog):
    assert tracker.WARN_PREFIX == WARN_PREFIX
    sink = tracker.ConsoleSink(total_steps=10)
    with caplog.at_level("INFO", logger="search_rl.progress"):
        sink.log({"reward/em": 0.2, WARN_PREFIX + "entropy_collapse": 1.0, WARN_PREFIX + "flat_groups": 0.0}, 3)
        sink.log({"reward/em": 0.2, WARN_PREFIX + "flat_groups": 0.0}, 4)
    first, second = [r.getMessage() for r in caplog.records]
    assert first.endswith("WARNING entropy_collapse") and "WARNING" not in second


def trajectory(texts: list[str], passages: list[str]) -> Trajectory:
    n = 4
    segments = tuple(Segment("model", 0, 1, t) for t in texts)
    calls = (SearchCall("q", tuple(Passage(str(i), "T", p) for i, p in enumerate(passages))),) if passages else ()
    return Trajectory(
        prompt_ids=torch.zeros(2, dtype=torch.long),
        response_ids=torch.zeros(n, dtype=torch.long),
        response_mask=torch.ones(n, dtype=torch.long),
        rollout_logprobs=None,
        segments=segments,
        final_answer=None,
        stop_reason="answer",
        stats=TrajectoryStats(),
        search_calls=calls,
    )


def test_trajectory_signals():
    looping = trajectory(["<think>" + "I need to search. " * 10 + "</think><answer>Paris</answer>"], ["Paris is big"])
    fresh = trajectory(["<think>the capital of France is asked</think><answer>Lyon</answer>"], ["Paris is big"])
    closed = trajectory(["<answer>Paris</answer>"], [])
    assert answer_copied(looping) is True and answer_copied(fresh) is False and answer_copied(closed) is None
    m = trajectory_health([looping, fresh, closed])
    assert m["health/think_repetition"] == pytest.approx((1 - 4 / 37) / 3)  # 40 words, 37 4-grams, 4 distinct
    assert m["health/answer_copy_rate"] == 0.5  # the closed-book answer saw no passage: not counted
