"""Training curves of a run as PNGs: ``python -m search_rl.tools.plot_metrics RUN_DIR [--out DIR]``.

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
    """One stage of a recipe (base, warm start, RL): its held-out EM and the training step it ends at, counted over
    the whole recipe; ``run_dir`` holds the stage's ``metrics.jsonl`` (None for the untrained base)."""

    name: str
    end_step: int
    heldout_em: float
    run_dir: Path | None = None


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
    left.plot([s.end_step for s in stages], ems, marker="o", color="tab:blue")
    for s in stages:
        left.annotate(
            f"{s.name}\n{s.heldout_em:.3f}",
            (s.end_step, s.heldout_em),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
    left.set_title("Held-out EM after each stage")
    left.set_xlabel("training step (whole recipe)")
    left.set_ylabel("EM (greedy, with search)")
    left.set_ylim(0, max(0.1, max(ems) * 1.4))
    for ax, s in zip(axes[0][1:], trained, strict=True):
        assert s.run_dir is not None
        series = read_metrics(s.run_dir / "metrics.jsonl")
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
