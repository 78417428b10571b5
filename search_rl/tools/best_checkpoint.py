"""Pick a run's checkpoint by its validation score: ``python -m search_rl.tools.best_checkpoint RUN_DIR``.

A run validated during training (``trainer.test_freq``, on ``data.val_files``: by default the shipped validation
split, a slice of train) logs ``val/<source>/<metric>`` to ``metrics.jsonl``. This reads those lines, keeps the
steps that still have a checkpoint (``global_step_N``), and prints the one with the best score: the checkpoint to
evaluate on test, once. Ties go to the earlier step (fewer updates for the same score). Step 0 (the validation
before training, ``trainer.val_before_train``) is shown for reference and never chosen: it is the starting model.

    python -m search_rl.tools.best_checkpoint runs/grpo                    # val/all/em
    python -m search_rl.tools.best_checkpoint runs/grpo --metric val/nq/f1

Last line: the chosen checkpoint's folder (``RUN_DIR/global_step_N``), so a script can take it with ``tail -1``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from search_rl.tracking.jsonl import iter_jsonl

DEFAULT_METRIC = "val/all/em"


def validation_scores(run_dir: Path, metric: str = DEFAULT_METRIC) -> dict[int, float]:
    """``{step: metric}`` of every validation ``run_dir/metrics.jsonl`` records (the last line of a step wins).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` (the run logs it with ``trainer.logger`` including ``jsonl``).
        ValueError: a line that is not a JSON object with an integer ``step`` (named by line number).
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: was the run logged with trainer.logger=[...,jsonl]?")
    scores: dict[int, float] = {}
    for number, row in iter_jsonl(path):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{number}: expected an object with an integer 'step'")
        if metric in row:
            scores[row["step"]] = float(row[metric])
    return scores


def saved_steps(run_dir: Path) -> set[int]:
    """Steps with a checkpoint folder (``global_step_N``) in ``run_dir``."""
    steps = set()
    for p in run_dir.glob("global_step_*"):
        suffix = p.name.removeprefix("global_step_")
        if p.is_dir() and suffix.isdigit():
            steps.add(int(suffix))
    return steps


def choose_step(scores: dict[int, float], saved: set[int]) -> int:
    """The best-scoring step among the saved, validated steps after step 0 (the earliest on ties).

    Raises:
        ValueError: no saved step after 0 was validated (saving and validating every N steps pairs them up).
    """
    candidates = sorted(s for s in scores if s > 0 and s in saved)
    if not candidates:
        raise ValueError(
            f"no checkpoint of a validated step: validated {sorted(scores)}, saved {sorted(saved)} "
            "(set trainer.save_freq to trainer.test_freq and keep them: trainer.max_ckpt_to_keep)"
        )
    return max(candidates, key=lambda s: (scores[s], -s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m search_rl.tools.best_checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("run_dir", type=Path, help="a training run's folder (trainer.default_local_dir)")
    ap.add_argument("--metric", default=DEFAULT_METRIC, help="validation metric to maximise (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        scores = validation_scores(args.run_dir, args.metric)
        step = choose_step(scores, saved_steps(args.run_dir))
    except (FileNotFoundError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    saved = saved_steps(args.run_dir)
    for s, score in sorted(scores.items()):
        mark = " <- best" if s == step else ("" if s in saved else " (no checkpoint)")
        sys.stdout.write(f"step {s:>4}  {args.metric} {score:.4f}{mark}\n")
    sys.stdout.write(f"{args.run_dir / f'global_step_{step}'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
