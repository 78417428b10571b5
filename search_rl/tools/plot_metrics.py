"""Training curves of a run as PNGs: ``python -m search_rl.tools.plot_metrics RUN_DIR [--out DIR]``.

``plot_recipe`` draws a whole recipe (the demo's ``recipe.png``): held-out EM per stage with 95% bars, the warm
start's NLL, and RL's reward per training sample as a running mean with a 95% band (per-step means of a few samples
are mostly noise: the mean of 16 samples of a 0/1 reward moves by about ±0.2 from step to step with nothing
learnt).

Reads ``<run>/metrics.jsonl`` (docs/training.md lists the keys) and writes one PNG per panel to ``<run>/plots/``:
reward and EM per data source, KL, entropy, response length, searches per trajectory, the search diagnostics
(valid-search and duplicate-query rates, gold retrieved, why answers are wrong, EM by number of searches, answer
length; see ``search_rl.reward.search_stats``), the early warnings (``search_rl.reward.health``), and time per
phase. Panels whose metrics are absent (no critic, no validation) are skipped. Uses matplotlib's Agg backend: no
display needed.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging
from search_rl.tracking.jsonl import read_jsonl

logger = logging.getLogger(__name__)

Series = dict[str, list[tuple[int, float]]]


@dataclass(frozen=True)
class Panel:
    """One PNG: a title and a predicate choosing the metric keys drawn on it."""

    name: str
    title: str
    ylabel: str
    select: Callable[[str], bool]


def _matches(pattern: str) -> Callable[[str], bool]:
    rx = re.compile(pattern)
    return lambda key: rx.fullmatch(key) is not None


PANELS = (
    Panel(
        "reward", "Reward and EM (train, per source)", "score", _matches(r"reward/(score_mean|em|[^/]+/score|[^/]+/em)")
    ),
    Panel("validation", "Validation EM (greedy, per source)", "EM", _matches(r"val/[^/]+/em")),
    Panel("kl", "KL to the reference / between updates", "nats", _matches(r"actor/(kl|ppo_kl|reward_kl_penalty)")),
    Panel("entropy", "Policy entropy (model tokens)", "nats", _matches(r"actor/entropy(_rollout)?")),
    Panel("response_length", "Response length", "tokens", _matches(r"response_length/(mean|model_tokens_mean|max)")),
    Panel(
        "searches",
        "Searches and turns per trajectory",
        "count",
        _matches(r"rollout/(searches_mean|turns_mean|valid_action_rate|answer_rate)"),
    ),
    Panel(
        "search_cost",
        "Search cost per step: live backend calls, answers replayed, estimated USD (docs/retriever.md)",
        "count / USD",
        _matches(r"rollout/(search_calls|searches_replayed|search_cost_usd)"),
    ),
    Panel(
        "search_quality",
        "Searches: valid, duplicate, gold answer retrieved",
        "rate",
        _matches(r"(rollout|val/all)/(valid_search_rate|duplicate_query_rate|gold_retrieved)"),
    ),
    Panel(
        "answer_outcomes",
        "Why answers are wrong (share of trajectories; with EM they sum to 1)",
        "share",
        _matches(r"reward/em|rollout/(no_answer|wrong_no_search|retrieval_missed|read_wrong)"),
    ),
    Panel("em_by_searches", "EM by number of searches (train)", "EM", _matches(r"rollout/em_searches_\w+")),
    Panel(
        "answer_length",
        "Answer length (words of the extracted answer)",
        "words",
        _matches(r"(rollout|val/all)/answer_words_mean"),
    ),
    Panel(
        "health",
        "Early warnings: flags (1 = fired), <think> repetition, answers copied",
        "share",
        _matches(r"health/.+"),
    ),
    Panel("timing", "Time per phase", "seconds", lambda k: k.startswith("timing/") and k != "timing/step_s"),
    Panel("losses", "Losses", "loss", _matches(r"actor/(pg_loss|loss)|critic/vf_loss|sft/nll")),
)
"""The panels, in the order of the summary."""


def read_metrics(path: Path) -> Series:
    """``metrics.jsonl`` as ``{key: [(step, value), ...]}`` (null values are skipped).

    Raises:
        FileNotFoundError: no such file (is the run's ``trainer.logger`` missing ``jsonl``?).
    """
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: plots need trainer.logger to include jsonl")
    series: Series = {}
    for record in read_jsonl(path):
        step = int(record.pop("step"))
        for key, value in record.items():
            if isinstance(value, int | float):
                series.setdefault(key, []).append((step, float(value)))
    return series


def plot_panel(series: Series, panel: Panel, out: Path) -> Path | None:
    """Draw the keys ``panel`` selects into ``out/<name>.png``; None when the run has none of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = sorted(k for k in series if panel.select(k))
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    tab20 = plt.get_cmap("tab20")
    ax.set_prop_cycle(color=[tab20(i) for i in range(tab20.N)])  # timing has more than 10 phases
    for key in keys:
        steps, values = zip(*series[key], strict=True)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path = out / f"{panel.name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_run(run_dir: Path, out: Path | None = None) -> list[Path]:
    """Render every panel of ``run_dir``'s metrics; returns the PNGs written (to ``<run>/plots`` by default)."""
    series = read_metrics(run_dir / "metrics.jsonl")
    out = out or run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = [p for panel in PANELS if (p := plot_panel(series, panel, out)) is not None]
    logger.info("wrote %d plots to %s", len(written), out)
    return written


@dataclass(frozen=True)
class Stage:
    """One stage of a recipe (base, warm start, RL): its held-out EM over ``questions`` questions and the training
    step it ends at, counted over the whole recipe; ``run_dir`` holds the stage's ``metrics.jsonl`` (None for the
    untrained base)."""

    name: str
    end_step: int
    heldout_em: float
    run_dir: Path | None = None
    questions: int | None = None


RUNNING_WINDOW = 64
"""Samples a running mean of per-sample rewards covers: with fewer, a step's mean moves by more than RL changes it."""

MIN_RUNNING = 16
"""Fewest samples a drawn point of the running mean stands on (one demo step's worth)."""

Z95 = 1.96
"""Normal quantile of a two-sided 95% band."""


def sample_rewards(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, reward)`` of every training sample a run dumped (``<run>/rollouts/train_step_*.jsonl``), in order."""
    out: list[tuple[int, float]] = []
    for path in sorted((run_dir / "rollouts").glob("train_step_*.jsonl")):
        out += [(int(r["step"]), float(r["reward"])) for r in read_jsonl(path)]
    return out


def running_band(values: list[float], window: int = RUNNING_WINDOW) -> tuple[list[float], list[float], list[float]]:
    """The mean of the last ``window`` values at each point (all of them before ``window``) and its 95% band
    ``(means, lows, highs)``. Rewards in [0, 1] get the Wilson interval of the mean read as a proportion: a [0, 1]
    variable's variance is at most ``p (1 - p)``, so the band is never narrower than the noise needs, and a run of
    equal samples (sample variance 0) still gets the width its count allows. Other rewards: ``Z95`` standard errors.

    >>> running_band([0.0, 1.0, 1.0, 0.0], window=2)[0]
    [0.0, 0.5, 1.0, 0.5]
    >>> [round(x, 2) for x in running_band([1.0] * 5)[1]]
    [0.21, 0.34, 0.44, 0.51, 0.57]
    """
    unit = all(0.0 <= v <= 1.0 for v in values)
    means, lows, highs = [], [], []
    for i in range(len(values)):
        part = values[max(0, i + 1 - window) : i + 1]
        mean = sum(part) / len(part)
        if unit:
            low, high = wilson_interval(mean, len(part))
        else:
            var = sum((v - mean) ** 2 for v in part) / (len(part) - 1) if len(part) > 1 else 0.0
            half = Z95 * (var / len(part)) ** 0.5
            low, high = mean - half, mean + half
        means.append(mean)
        lows.append(low)
        highs.append(high)
    return means, lows, highs


def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion ``p`` over ``n`` trials (an EM's error bar; it stays inside [0, 1]).

    >>> [round(x, 3) for x in wilson_interval(0.2, 50)]
    [0.112, 0.33]
    """
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * ((p * (1 - p) + z2 / (4 * n)) / n) ** 0.5 / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _plot_rewards(ax: Any, s: Stage, rewards: list[tuple[int, float]]) -> None:
    """Per-sample rewards of an RL stage: the running mean of ``RUNNING_WINDOW`` samples with its 95% band, drawn
    from the ``MIN_RUNNING``-th sample on, and each step's mean with its own 95% error bar, so a change smaller than
    the band reads as the noise it is."""
    values = [r for _, r in rewards]
    means, lows, highs = running_band(values)
    first = min(MIN_RUNNING, len(values)) - 1  # a mean of the first few samples would read as a trend
    x = list(range(first + 1, len(values) + 1))
    ax.plot(x, means[first:], color="tab:blue", label=f"reward, running mean of {MIN_RUNNING}-{RUNNING_WINDOW} samples")
    ax.fill_between(x, lows[first:], highs[first:], color="tab:blue", alpha=0.2, label="95% band")
    steps = sorted({step for step, _ in rewards})
    ends, step_means, below, above = [], [], [], []
    for step in steps:
        part = [r for st, r in rewards if st == step]
        ends.append(max(i + 1 for i, (st, _) in enumerate(rewards) if st == step))
        mean, low, high = (series[-1] for series in running_band(part, window=len(part)))
        step_means.append(mean)
        below.append(mean - low)
        above.append(high - mean)
    per_step = len(values) // max(len(steps), 1)
    ax.errorbar(
        ends,
        step_means,
        yerr=[below, above],
        fmt="o",
        color="tab:orange",
        capsize=3,
        label=f"step mean ({per_step} samples) ± 95%",
    )
    if all(0.0 <= v <= 1.0 for v in values):
        ax.set_ylim(0.0, 1.0)  # the whole range a reward can take: a zoomed axis draws noise as a slope
    ax.set_title(f"{s.name}: reward per training sample ({len(values)} in all)")
    ax.set_xlabel("training samples seen")


def plot_recipe(stages: list[Stage], out: Path) -> Path:
    """``out/recipe.png``: held-out EM after each stage (left), then each trained stage's own signals per step (the
    warm start's NLL, RL's reward and EM), so the rise through the recipe reads at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out.mkdir(parents=True, exist_ok=True)
    trained = [s for s in stages if s.run_dir is not None and (s.run_dir / "metrics.jsonl").is_file()]
    fig, axes = plt.subplots(1, 1 + len(trained), figsize=(5 * (1 + len(trained)), 4), dpi=100, squeeze=False)
    left = axes[0][0]
    ems = [s.heldout_em for s in stages]
    spans = [wilson_interval(s.heldout_em, s.questions) if s.questions else (s.heldout_em,) * 2 for s in stages]
    bars = [
        [e - lo for e, (lo, _) in zip(ems, spans, strict=True)],
        [hi - e for e, (_, hi) in zip(ems, spans, strict=True)],
    ]
    left.errorbar([s.end_step for s in stages], ems, yerr=bars, marker="o", color="tab:blue", capsize=3)
    for s in stages:
        left.annotate(
            f"{s.name}\n{s.heldout_em:.3f}",
            (s.end_step, s.heldout_em),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
    asked = {s.questions for s in stages if s.questions}
    left.set_title(
        "Held-out EM after each stage" + (f" ({asked.pop()} questions, 95% bars)" if len(asked) == 1 else "")
    )
    left.set_xlabel("training step (whole recipe)")
    left.set_ylabel("EM (greedy, with search)")
    left.set_ylim(0, max(0.1, max(hi for _, hi in spans) * 1.2))
    for ax, s in zip(axes[0][1:], trained, strict=True):
        assert s.run_dir is not None
        series = read_metrics(s.run_dir / "metrics.jsonl")
        rewards = sample_rewards(s.run_dir)
        if rewards:
            _plot_rewards(ax, s, rewards)
            ax.legend(fontsize=7)
            continue
        for key in ("sft/nll", "reward/score_mean", "reward/em"):
            if key in series:
                x, y = zip(*series[key], strict=True)
                ax.plot(x, y, marker="o", markersize=3, label=key)
        ax.set_title(f"{s.name}: training signals")
        ax.set_xlabel(f"{s.name} step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "recipe.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="a run folder holding metrics.jsonl")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_DIR/plots)")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as e:
        logger.error("%s", e)
        return 2
    for p in paths:
        logger.info("  %s", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
