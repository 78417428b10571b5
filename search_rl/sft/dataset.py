"""``SFTDataset``: warm-start parquet rows → trajectories → padded ``TrainBatch``es with the RL loss mask.

Rows are Search-R1 rows (``search_rl.prompt_data.read_rows`` checks them) with a ``trajectory`` column
(``search_rl.sft.trajectories``). Examples that do not fit the rollout budgets are left out and counted by reason
(``skipped``); anything malformed is an error naming the file and row. ``search_rl.prompt_data.PromptLoader`` serves the
batches (seeded order per epoch, resumable), exactly as it serves prompts to the RL trainer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import pandas as pd
from transformers import PreTrainedTokenizerBase

from search_rl.algorithms import loss_mask_for
from search_rl.batches import BatchMeta, PromptBatch, TrainBatch
from search_rl.config import AlgorithmConfig, RolloutConfig
from search_rl.datatypes import Trajectory
from search_rl.prompt_data import PromptRow, encode_prompt, read_rows, resolve_data_path
from search_rl.rollout.observations import ObservationBuilder
from search_rl.sft.trajectories import SkipExample, build_trajectory, parse_turns
from search_rl.trainer.steps import build_train_batch

logger = logging.getLogger(__name__)

TRAJECTORY_COLUMN = "trajectory"


def read_turn_columns(files: Sequence[str]) -> list[tuple[str, object]]:
    """``(where, trajectory value)`` of every row, in the order of ``read_rows(files)``.

    Raises:
        ValueError: a file has no ``trajectory`` column.
    """
    out: list[tuple[str, object]] = []
    for name in files:
        path = resolve_data_path(name)
        frame = pd.read_parquet(path)
        if TRAJECTORY_COLUMN not in frame.columns:
            raise ValueError(
                f"{path} has no `{TRAJECTORY_COLUMN}` column: it is not a warm-start file "
                "(write one with `python -m data_prep.synth_sft`, docs/data.md)"
            )
        out.extend((f"{path} row {i}", value) for i, value in enumerate(frame[TRAJECTORY_COLUMN]))
    return out


class SFTDataset:
    """Warm-start examples, tokenized and assembled under the rollout budgets.

    Args:
        files: SFT parquet files.
        tokenizer: the policy's tokenizer (prompts through its chat template, as in RL).
        rollout: the budgets and turn limits the trajectories must fit (the RL run's ``actor_rollout_ref.rollout``).
        mask_observations: keep retrieved tokens out of the loss (``algorithm.mask_observations`` in RL).
        skip_overlong: leave out (and count) examples over a budget instead of raising.
    """

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        rollout: RolloutConfig,
        mask_observations: bool = True,
        skip_overlong: bool = True,
    ) -> None:
        rows = read_rows(files)
        raw = read_turn_columns(files)
        observations = ObservationBuilder(tokenizer)
        self.rows: list[PromptRow] = []
        self.trajectories: list[Trajectory] = []
        self.skipped: Counter[str] = Counter()
        for row, (where, value) in zip(rows, raw, strict=True):
            turns = parse_turns(value, where, rollout.max_query_chars)
            prompt = encode_prompt(tokenizer, row.messages)
            try:
                trajectory = build_trajectory(prompt, turns, tokenizer, observations, rollout)
            except SkipExample as e:
                if not skip_overlong:
                    raise ValueError(f"{where}: {e}; raise the budget or set data.filter_overlong_prompts=true") from e
                self.skipped[e.reason] += 1
                continue
            self.rows.append(row)
            self.trajectories.append(trajectory)
        if self.skipped:
            logger.warning(
                "left out %d of %d warm-start examples over the rollout budgets: %s",
                sum(self.skipped.values()),
                len(rows),
                dict(self.skipped),
            )
        if not self.rows:
            raise ValueError(f"no warm-start example fits the rollout budgets ({dict(self.skipped)}); raise them")
        self.algo = AlgorithmConfig(mask_observations=mask_observations)
        self.pad_token_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: Sequence[int]) -> TrainBatch:
        """The examples at ``indices`` collated into a ``TrainBatch`` with ``loss_mask`` set."""
        rows = [self.rows[i] for i in indices]
        trajectories = [self.trajectories[i] for i in indices]
        prompts = PromptBatch(
            prompt_ids=tuple(tuple(int(x) for x in t.prompt_ids) for t in trajectories),
            uids=tuple(r.uid for r in rows),
            data_sources=tuple(r.data_source for r in rows),
            targets=tuple(r.targets for r in rows),
            questions=tuple(r.question for r in rows),
            row_indices=tuple(r.index for r in rows),
        )
        width = max(int(t.response_ids.shape[0]) for t in trajectories)
        batch = build_train_batch(trajectories, prompts, self.pad_token_id, width, BatchMeta())
        return batch.replace(loss_mask=loss_mask_for(batch.response_mask, batch.attention_mask, self.algo))

    def stats(self) -> dict[str, float]:
        """Counts for the run log: examples kept, left out by reason, mean model/observation tokens."""
        n = len(self.trajectories)
        model = sum(int(t.response_mask.sum()) for t in self.trajectories)
        total = sum(int(t.response_ids.shape[0]) for t in self.trajectories)
        out = {
            "data/sft_examples": float(n),
            "data/sft_model_tokens_mean": model / n,
            "data/sft_observation_tokens_mean": (total - model) / n,
            "data/sft_searches_mean": sum(t.num_searches for t in self.trajectories) / n,
        }
        out.update({f"data/sft_skipped_{reason}": float(c) for reason, c in self.skipped.items()})
        return out
