"""The run folder's record of its budgets (``budgets.json``): a rerun reuses the folder's checkpoints and
evaluations only when they were made with the same settings."""

from __future__ import annotations

import json
from typing import Any

from search_rl.demo.settings import TURN_TOKENS, DemoSettings

BUDGETS_FILE = "budgets.json"
"""The run folder's record of the settings its checkpoints and evaluations were made with."""


def run_budgets(s: DemoSettings) -> dict[str, Any]:
    """The settings that make two runs' checkpoints and scores incomparable."""
    return {
        "model": s.model,
        "max_turns": s.max_turns,
        "max_turn_tokens": TURN_TOKENS,
        "max_obs_tokens": s.max_obs_tokens,
        "max_response_tokens": s.max_response_tokens,
        "seed": s.seed,
        "gen_batches": s.gen_batches,
    }


RECORDED_BEFORE = {"seed": 0, "gen_batches": 1}
"""What a run folder recorded before a setting joined ``run_budgets`` was made with."""


def check_budgets(s: DemoSettings) -> None:
    """Refuse to reuse a run folder made with other budgets (its stages would be mixed with this run's); record the
    budgets of a fresh or new folder."""
    path = s.run_dir / BUDGETS_FILE
    current = run_budgets(s)
    if not s.fresh:
        if path.exists():
            recorded = json.loads(path.read_text())
            recorded = {**RECORDED_BEFORE, **recorded}
            diff = {k: (recorded.get(k), v) for k, v in current.items() if recorded.get(k) != v}
            if diff:
                changes = ", ".join(f"{k}: {old} there, {new} now" for k, (old, new) in diff.items())
                raise ValueError(
                    f"{s.run_dir} holds a demo run made with other settings ({changes}); "
                    "pass --fresh to train it again or --run-dir for a new folder"
                )
        elif any((s.run_dir / d).exists() for d in ("sft", "rl", "eval")):
            raise ValueError(
                f"{s.run_dir} holds a demo run without {BUDGETS_FILE} (made before the demo recorded its budgets; "
                "it used 160-token observations); pass --fresh to train it again or --run-dir for a new folder"
            )
    s.run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=1) + "\n")
