"""plot_metrics renders a run's metrics.jsonl (written by the trainer's own JsonlSink) to PNGs.

Run: python -m pytest tests/search_rl/tools/test_plot_metrics.py -q
"""

from __future__ import annotations

import json

import pytest

from search_rl.tools.plot_metrics import (
    PANELS,
    RUNNING_WINDOW,
    main,
    plot_run,
    read_metrics,
    running_band,
    sample_rewards,
    wilson_interval,
)
from search_rl.tracking import build_tracker


def test_plots_from_tracker_metrics(tmp_path):
    tracker = build_tracker(["jsonl"], tmp_path, 3, "p", "e", {})
    for step in (1, 2, 3):
        tracker.log(
            {
                "reward/score_mean": step / 10,
                "reward/em": step / 10,
                "reward/nq/em": 0.2,
                "reward/hotpotqa/em": 0.1,
                "actor/ppo_kl": 0.01 * step,
                "actor/entropy": 2.0,
                "response_length/mean": 100.0 + step,
                "rollout/searches_mean": 1.5,
                "timing/rollout_s": 3.0,
                "timing/update_actor_s": 1.0,
                "timing/step_s": 5.0,
                "actor/kl_loss": float("nan"),
            },
            step,
        )
    tracker.close()
    series = read_metrics(tmp_path / "metrics.jsonl")
    assert series["reward/em"] == [(1, 0.1), (2, 0.2), (3, 0.3)] and "actor/kl_loss" not in series
    paths = plot_run(tmp_path)
    names = {p.stem for p in paths}
    assert {"reward", "kl", "entropy", "response_length", "searches", "timing"} <= names
    assert "validation" not in names  # no val/ metrics in this run
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5_000


def test_search_panels(tmp_path):
    tracker = build_tracker(["jsonl"], tmp_path, 2, "p", "e", {})
    for step in (1, 2):
        tracker.log(
            {
                "reward/em": 0.2,
                "rollout/valid_search_rate": 0.9,
                "rollout/duplicate_query_rate": 0.1 * step,
                "rollout/gold_retrieved": 0.5,
                "rollout/read_wrong": 0.3,
                "rollout/retrieval_missed": 0.4,
                "rollout/no_answer": 0.1,
                "rollout/em_searches_1": 0.3,
                "rollout/n_searches_1": 4.0,
                "rollout/answer_words_mean": 2.5,
            },
            step,
        )
    tracker.close()
    names = {p.stem for p in plot_run(tmp_path)}
    assert {"search_quality", "answer_outcomes", "em_by_searches", "answer_length"} <= names
    assert "searches" not in names, "the count panel draws searches_mean/turns_mean, absent here"
    series = read_metrics(tmp_path / "metrics.jsonl")
    panels = {p.name: p for p in PANELS}
    assert sorted(k for k in series if panels["em_by_searches"].select(k)) == ["rollout/em_searches_1"]
    assert sorted(k for k in series if panels["answer_outcomes"].select(k)) == [
        "reward/em",
        "rollout/no_answer",
        "rollout/read_wrong",
        "rollout/retrieval_missed",
    ]


def test_missing_metrics_is_a_clear_error(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="jsonl"):
        plot_run(tmp_path)
    assert main([str(tmp_path)]) == 2


def test_recipe_plot_draws_every_stage(tmp_path):
    from search_rl.tools.plot_metrics import Stage, plot_recipe

    sft = tmp_path / "sft"
    tracker = build_tracker(["jsonl"], sft, 3, "p", "e", {})
    for step in (1, 2):
        tracker.log({"sft/nll": 2.0 / step}, step)
    tracker.close()
    rl = tmp_path / "rl"
    tracker = build_tracker(["jsonl"], rl, 3, "p", "e", {})
    tracker.log({"reward/score_mean": 0.2, "reward/em": 0.1}, 1)
    tracker.close()
    (rl / "rollouts").mkdir()
    for step in (1, 2, 3):  # 16 dumped samples a step, as the demo's RL stage writes them
        rows = [json.dumps({"step": step, "reward": float(i % 3 == 0)}) for i in range(16)]
        (rl / "rollouts" / f"train_step_{step:06d}.jsonl").write_text("\n".join(rows) + "\n")
    stages = [Stage("base", 0, 0.0, questions=50), Stage("sft", 2, 0.13, sft, 50), Stage("rl", 3, 0.21, rl, 50)]
    path = plot_recipe(stages, tmp_path / "plots")
    assert path == tmp_path / "plots" / "recipe.png" and path.stat().st_size > 10_000
    assert [r for _, r in sample_rewards(rl)][:4] == [1.0, 0.0, 0.0, 1.0] and len(sample_rewards(rl)) == 48


def test_the_reward_band_covers_the_noise_of_a_step_of_sixteen_samples():
    """A constant policy (reward 1 with probability 0.3): per-step means of 16 samples scatter widely, and the 95% band
    of the running mean holds the true mean at nearly every point (its width is what a reader must not read as a
    trend)."""
    import random

    rng = random.Random(0)
    values = [float(rng.random() < 0.3) for _ in range(16 * 40)]
    steps = [sum(values[i : i + 16]) / 16 for i in range(0, len(values), 16)]
    assert max(steps) - min(steps) > 0.3  # a plot of step means draws "trends" from nothing
    means, lows, highs = running_band(values)
    covered = [lo <= 0.3 <= hi for lo, hi in zip(lows[RUNNING_WINDOW:], highs[RUNNING_WINDOW:], strict=True)]
    assert sum(covered) / len(covered) > 0.85
    assert all(hi - lo < 0.26 for lo, hi in zip(lows[RUNNING_WINDOW:], highs[RUNNING_WINDOW:], strict=True))
    assert all(lo <= m <= hi for m, lo, hi in zip(means, lows, highs, strict=True))
    # a lucky start (the first samples all right) is not drawn as a certainty: the band is as wide as the count allows
    _, lows, highs = running_band([1.0] * 5 + values)
    assert highs[4] == 1.0 and lows[4] < 0.6
    # rewards outside [0, 1] (a format penalty) get standard errors instead
    _, lows, highs = running_band([-1.0, 1.0] * 32)
    assert lows[-1] < 0 < highs[-1] and highs[-1] - lows[-1] < 1
    low, high = wilson_interval(0.2, 50)
    assert 0 < low < 0.2 < high < 1 and wilson_interval(0.0, 50)[0] == 0.0
