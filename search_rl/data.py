"""Prompt data: Search-R1 parquet rows → tokenized ``PromptBatch``es, with a resumable, seeded loader.

``PromptDataset`` reads the rows once (``docs/data.md``: ``prompt`` chat messages, ``data_source``,
``reward_model.ground_truth.target``, ``extra_info.id``, ``question``) and tokenizes every prompt with the
policy's chat template. ``PromptLoader`` hands out batches of ``train_batch_size`` prompts, each repeated
``rollout.n`` times in a row; the samples of a prompt share its globally unique id, which keys its GRPO group.
Its position is two integers (epoch, batches taken in that epoch) and each epoch's order is a permutation seeded by
``seed + epoch``, so ``state_dict``/``load_state_dict`` resume exactly where a run stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase

from search_rl.agent.prompts import encode_prompt
from search_rl.protocol import PromptBatch

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")


def resolve_data_path(path: str) -> Path:
    """``path`` as given if it exists, else relative to the repository (so runs work from any directory).

    Raises:
        FileNotFoundError: in neither place.
    """
    p = Path(path).expanduser()
    if p.exists():
        return p
    if not p.is_absolute() and (REPO_ROOT / p).exists():
        return REPO_ROOT / p
    raise FileNotFoundError(f"data file {path} not found (looked in the working directory and in {REPO_ROOT})")


@dataclass(frozen=True)
class PromptRow:
    """One question: its prompt messages, gold answers and identity."""

    uid: str
    data_source: str
    messages: tuple[dict[str, str], ...]
    targets: tuple[str, ...]
    question: str
    index: int


def _row(record: dict[str, Any], file: Path, position: int) -> PromptRow:
    extra = record["extra_info"] or {}
    uid = extra.get("id")
    if not uid:
        raise ValueError(f"{file} row {position}: extra_info.id is missing; GRPO groups need a unique id per row")
    targets = record["reward_model"]["ground_truth"]["target"]
    messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in record["prompt"])
    return PromptRow(
        uid=str(uid),
        data_source=str(record["data_source"]),
        messages=messages,
        targets=tuple(str(t) for t in targets),
        question=str(record.get("question") or ""),
        index=int(extra.get("index", position)),
    )


def read_rows(files: Sequence[str]) -> list[PromptRow]:
    """Every row of the parquet files, in file order.

    Raises:
        FileNotFoundError: a file is missing. ValueError: a column is missing, or two rows share an id.
    """
    rows: list[PromptRow] = []
    for name in files:
        path = resolve_data_path(name)
        frame = pd.read_parquet(path)
        missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"{path} lacks the columns {missing} of Search-R1 rows (docs/data.md)")
        rows.extend(_row(rec, path, i) for i, rec in enumerate(frame.to_dict(orient="records")))
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.uid in seen:
            raise ValueError(f"rows {seen[row.uid]} and {i} share extra_info.id {row.uid!r}; ids must be unique")
        seen[row.uid] = i
    return rows


class PromptDataset:
    """Rows with their prompts tokenized by the policy's chat template.

    Args:
        rows: the rows.
        tokenizer: the policy's tokenizer.
        max_prompt_tokens: longest prompt allowed.
        drop_overlong: drop longer prompts (logged) instead of raising.
    """

    def __init__(
        self, rows: Sequence[PromptRow], tokenizer: PreTrainedTokenizerBase, max_prompt_tokens: int, drop_overlong: bool
    ) -> None:
        kept: list[tuple[PromptRow, tuple[int, ...]]] = []
        for row in rows:
            ids = tuple(encode_prompt(tokenizer, row.messages))
            if len(ids) > max_prompt_tokens:
                if not drop_overlong:
                    raise ValueError(
                        f"row {row.uid}: prompt has {len(ids)} tokens > rollout.max_prompt_tokens={max_prompt_tokens}; "
                        "raise the budget or set data.filter_overlong_prompts=true"
                    )
                continue
            kept.append((row, ids))
        if len(kept) < len(rows):
            logger.warning(
                "dropped %d of %d prompts over %d tokens", len(rows) - len(kept), len(rows), max_prompt_tokens
            )
        if not kept:
            raise ValueError("no prompt left after filtering; check the data files and rollout.max_prompt_tokens")
        self.rows = [r for r, _ in kept]
        self.prompt_ids = [ids for _, ids in kept]

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: Sequence[int]) -> PromptBatch:
        """The rows at ``indices`` as a ``PromptBatch`` (one sample each)."""
        rows = [self.rows[i] for i in indices]
        return PromptBatch(
            prompt_ids=tuple(self.prompt_ids[i] for i in indices),
            uids=tuple(r.uid for r in rows),
            data_sources=tuple(r.data_source for r in rows),
            targets=tuple(r.targets for r in rows),
            questions=tuple(r.question for r in rows),
            row_indices=tuple(r.index for r in rows),
        )

    def subset_indices(self, max_samples: int | None, seed: int) -> list[int]:
        """A fixed, seeded subset of ``max_samples`` rows, in file order (all rows when None or larger)."""
        if max_samples is None or max_samples >= len(self):
            return list(range(len(self)))
        perm = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        return sorted(perm[:max_samples].tolist())


class Batchable(Protocol):
    """What ``PromptLoader`` serves from: ``PromptDataset`` (RL prompts) or ``sft.data.SFTDataset`` (examples)."""

    def __len__(self) -> int: ...

    def batch(self, indices: Sequence[int]) -> Any: ...


class PromptLoader:
    """Endless batches of ``batch_size`` prompts × ``n_samples``; drops each epoch's incomplete last batch.

    Args:
        dataset: tokenized rows (or any ``Batchable``).
        batch_size: prompts per batch.
        n_samples: samples per prompt (``rollout.n``); they are adjacent in the batch.
        shuffle: a new seeded order each epoch; else file order.
        seed: base seed of the orders.
    """

    def __init__(self, dataset: Batchable, batch_size: int, n_samples: int, shuffle: bool, seed: int) -> None:
        if batch_size > len(dataset):
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {len(dataset)} training prompts")
        self.dataset, self.batch_size, self.n_samples = dataset, batch_size, n_samples
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self.batches_taken = 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        return torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def next_batch(self) -> Any:
        """The next batch, already repeated ``n_samples`` times per prompt."""
        if self.batches_taken >= self.batches_per_epoch:
            self.epoch, self.batches_taken = self.epoch + 1, 0
        start = self.batches_taken * self.batch_size
        indices = self._order(self.epoch)[start : start + self.batch_size]
        self.batches_taken += 1
        return self.dataset.batch(indices).repeat_interleave(self.n_samples)

    def state_dict(self) -> dict[str, int]:
        """Position to resume from (plus the dataset size, to catch a changed dataset)."""
        return {"epoch": self.epoch, "batches_taken": self.batches_taken, "num_rows": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state_dict()``.

        Raises:
            ValueError: the dataset has a different number of rows than when the state was saved.
        """
        if state["num_rows"] != len(self.dataset):
            raise ValueError(
                f"the checkpoint's data loader saw {state['num_rows']} rows, the data now has {len(self.dataset)}; "
                "resume with the same data files, or start a new run (trainer.resume=disable)"
            )
        self.epoch, self.batches_taken = state["epoch"], state["batches_taken"]
