"""What a demo run is made of: its knobs (``DemoSettings``), the per-turn budget, the stages it compares, and the
shipped data it reads (checked by ``check_data`` before anything starts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retriever_server.settings import SHIPPED_CORPUS

DATASET_DIR = Path("data/datasets/nq_hotpotqa_mini")
RL_QUESTIONS = DATASET_DIR / "rl_kept.parquet"
"""The training questions RL draws from: those the recipe's warm start answered right in 1 to 3 of 4 samples
(``bench/rl_stages.sh 1``; counts in ``rl_kept.manifest.json``). A question it always or never solves gives GRPO a
group of equal rewards, which teaches nothing."""
CORPUS = SHIPPED_CORPUS


TURN_TOKENS = 64
"""Tokens the policy may write per turn."""

STAGES = ("base", "sft", "rl")
"""The rows of the demo's table, in recipe order."""


@dataclass(frozen=True)
class DemoSettings:
    """The knobs of the demo run (the rest is the default recipe)."""

    sft_steps: int
    sft_batch: int
    steps: int
    prompts: int
    group_size: int
    eval_samples: int
    run_dir: Path
    model: str
    max_turns: int
    fresh: bool
    max_obs_tokens: int = 384
    """Tokens of retrieved passages shown per search (the trainer's default; 160 cut the answer out of a third of
    the NQ passages, docs/learning.md)."""
    seed: int = 0
    """``trainer.seed`` of the warm start and RL (data order, sampling); the evaluation questions stay the same."""
    gen_batches: int = 2
    """Most generation batches per RL step: DAPO's dynamic sampling drops the groups whose rewards are all equal and
    rolls out further prompts, up to this many batches, to fill the step with groups that carry signal (1: off)."""
    dtype: str = "auto"
    """``model.dtype`` of every stage: ``auto`` (bf16 where the machine computes it faster, docs/training.md
    "Compute dtype"), ``float32`` or ``bfloat16``."""

    @property
    def max_response_tokens(self) -> int:
        """The response budget: a 64-token turn per search, the answer turn and one turn of tags' slack, plus every
        observation (1024 for the defaults, the budget of the learning runs)."""
        return (self.max_turns + 2) * TURN_TOKENS + self.max_turns * self.max_obs_tokens

    def stage_dir(self, stage: str) -> Path:
        """Where a training stage (``sft``, ``rl``) writes its checkpoints, metrics and rollouts."""
        return self.run_dir / stage


def check_data() -> None:
    """Make sure the shipped corpus and datasets are there.

    Raises:
        FileNotFoundError: naming the missing files and how to restore them (they are part of the repository).
    """
    missing = [p for p in (CORPUS, DATASET_DIR / "train.parquet", DATASET_DIR / "test.parquet") if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"missing {', '.join(map(str, missing))}: the demo runs from the repository root, and these files are "
            "part of it; restore them with `git checkout -- data/` (docs/data.md says how they are rebuilt)"
        )
