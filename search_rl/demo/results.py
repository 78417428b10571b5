"""What the demo leaves at the end: the curves (``plots/``), ``results.md``, and the summary that says where
everything is and what to run next."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from search_rl.demo.settings import DemoSettings
from search_rl.tools.compare_evals import EvalRun

logger = logging.getLogger(__name__)


def plot(s: DemoSettings, stages: list[EvalRun]) -> list[Path]:
    """The recipe's curves (``plots/recipe.png``) and each training stage's panels (``plots/<stage>/``); none, with
    a warning, when matplotlib is missing."""
    try:
        from search_rl.tools.plot_metrics import Stage, plot_recipe, plot_run
    except ImportError as e:
        logger.warning("no plots: %s (pip install matplotlib)", e)
        return []
    out = s.run_dir / "plots"
    written = [p for stage in ("sft", "rl") for p in plot_run(s.stage_dir(stage), out / stage)]
    ends = {"base": 0, "sft": s.sft_steps, "rl": s.sft_steps + s.steps}
    points = [
        Stage(
            r.name,
            ends[r.name],
            r.metrics["eval/all/em"],
            s.stage_dir(r.name) if r.name != "base" else None,
            questions=s.eval_samples,
        )
        for r in stages
    ]
    return [plot_recipe(points, out), *written]


def write_results(s: DemoSettings, report: str, seconds: dict[str, float]) -> None:
    """``results.md`` in the run folder: the table and the seconds each phase took."""
    (s.run_dir / "results.md").write_text(
        "# Demo results\n\n" + report + "\n\nSeconds: " + json.dumps({k: round(v) for k, v in seconds.items()}) + "\n"
    )


def summarize(s: DemoSettings, report: str, checkpoint: Path, plots: list[Path], seconds: dict[str, float]) -> None:
    """The table, where everything is, and what to run next."""
    run = s.run_dir
    rl = s.stage_dir("rl")
    times = ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items())
    samples = s.steps * s.prompts * s.group_size
    lines = [
        "",
        report,
        "",
        f"What RL shows at this size: {s.steps} steps of {s.prompts} prompts x {s.group_size} samples ({samples} "
        "samples trained on) move the held-out EM by a question or two either way; recipe.png draws RL's reward as "
        "a running mean with its 95% band, and a change inside the band is noise. The 300-question runs, with their "
        "significance, are in docs/learning.md.",
        "",
        "demo done:",
        f"  policy       {checkpoint}/actor   (an HF model folder; the warm start is under {s.stage_dir('sft')})",
        f"  metrics      {rl / 'metrics.jsonl'}   and {s.stage_dir('sft') / 'metrics.jsonl'}",
        f"  plots        {run / 'plots'}/recipe.png   and {len(plots) - 1} panels under {run / 'plots'}/",
        f"  rollouts     {rl / 'rollouts'}/   and {run / 'eval'}/<stage>/search-<time>/trajectories.jsonl",
        f"  results      {run / 'results.md'}",
        f"  view them    python -m search_rl.tools.rollout_viewer {rl}",
        f"  train more   python -m search_rl.demo --steps {s.steps * 2}",
        f"  times        {times}",
    ]
    logger.info("\n".join(lines))
