"""Prompt data: Search-R1 parquet rows → tokenized ``PromptBatch``es, with a resumable, seeded loader.

``read_rows`` reads the rows once and validates each against ``RowSchema`` (``docs/data.md``: ``prompt`` chat
messages, ``data_source``, ``reward_model.ground_truth.target``, ``extra_info.id``, ``question``): a file with an
invalid row is refused with the file, row and field named, never half-read. ``PromptDataset`` tokenizes every prompt
with the policy's chat template (``encode_prompt``, which every rollout's prompt goes through). ``PromptLoader``
hands out batches of ``train_batch_size`` prompts, each repeated ``rollout.n`` times in a row; the samples of a
prompt share its globally unique id, which keys its GRPO group. Its position is two integers (epoch, batches taken
in that epoch) and each epoch's order is a permutation seeded by ``seed + epoch``, so
``state_dict``/``load_state_dict`` resume exactly where a run stopped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from transformers import PreTrainedTokenizerBase

from search_rl.batches import PromptBatch
from search_rl.seeds import epoch_seed

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


Text = Annotated[str, StringConstraints(strict=True, pattern=r"\S")]
"""A string with at least one non-space character (no numbers taken for strings, no blank values)."""


class _Schema(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Message(_Schema):
    role: Text
    content: Text


class _GroundTruth(_Schema):
    target: list[Text] = Field(min_length=1)


class _RewardModel(_Schema):
    ground_truth: _GroundTruth


class _ExtraInfo(_Schema):
    id: Text
    index: int | None = None


class RowSchema(_Schema):
    """The fields of a Search-R1 row the trainer reads (``docs/data.md#row-schema``); other fields are ignored.

    ``reward_model.ground_truth.target`` must be a non-empty list of strings: a bare string would otherwise be read
    as a list of its characters, and a one-letter answer would then score exact match. ``question`` may be absent
    (older files) but not blank.
    """

    data_source: Text
    prompt: list[_Message] = Field(min_length=1)
    reward_model: _RewardModel
    extra_info: _ExtraInfo
    question: Text | None = None


MAX_REPORTED_ERRORS = 5
"""Invalid rows quoted in the error (all are counted)."""


def _plain(value: Any) -> Any:
    """Parquet values as plain Python: numpy arrays → lists, numpy scalars → Python scalars (recursively)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


PLAIN_MESSAGES = {"missing": "missing", "string_pattern_mismatch": "blank", "too_short": "empty"}
"""Pydantic error types reworded for the data error (the rest keep pydantic's message)."""


def _problems(error: ValidationError) -> list[str]:
    """``field: what is wrong (got ...)`` for each error pydantic found in one row."""
    out = []
    for e in error.errors():
        where = ".".join(str(part) for part in e["loc"]) or "row"
        what = PLAIN_MESSAGES.get(e["type"]) or re.sub(r" or instance of \w+", "", e["msg"])
        got = "" if e["type"] == "missing" else f" (got {type(e['input']).__name__} {repr(e['input'])[:60]})"
        out.append(f"{where}: {what}{got}")
    return out


def _row(schema: RowSchema, position: int) -> PromptRow:
    return PromptRow(
        uid=schema.extra_info.id,
        data_source=schema.data_source,
        messages=tuple({"role": m.role, "content": m.content} for m in schema.prompt),
        targets=tuple(schema.reward_model.ground_truth.target),
        question=schema.question or "",
        index=schema.extra_info.index if schema.extra_info.index is not None else position,
    )


def read_file_rows(path: Path) -> list[PromptRow]:
    """Every row of one parquet file, each validated against ``RowSchema``.

    Raises:
        ValueError: a column is missing, or any row is invalid; the message names the file, each bad row (first
            ``MAX_REPORTED_ERRORS``) and its field, and counts them all.
    """
    frame = pd.read_parquet(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing} of Search-R1 rows (docs/data.md)")
    rows: list[PromptRow] = []
    errors: list[str] = []
    bad = 0
    records = frame.to_dict(orient="records")
    for i, record in enumerate(records):
        try:
            rows.append(_row(RowSchema.model_validate(_plain(record)), i))
        except ValidationError as e:
            bad += 1
            errors += [f"row {i}: {p}" for p in _problems(e)]
    if bad:
        shown = "\n  ".join(errors[:MAX_REPORTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_REPORTED_ERRORS} more" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise ValueError(
            f"{path}: {bad} of {len(records)} rows are invalid (the row schema is in docs/data.md#row-schema):\n"
            f"  {shown}{more}\nFix the file; `python -m data_prep.qa_to_parquet --skip-invalid` rebuilds one from its "
            "questions and answers, skipping (and counting) the bad records"
        )
    return rows


def read_rows(files: Sequence[str]) -> list[PromptRow]:
    """Every row of the parquet files, in file order, validated (``read_file_rows``).

    Raises:
        FileNotFoundError: a file is missing. ValueError: a column is missing, a row is invalid, or two rows share
            an id.
    """
    rows: list[PromptRow] = []
    for name in files:
        rows.extend(read_file_rows(resolve_data_path(name)))
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.uid in seen:
            raise ValueError(f"rows {seen[row.uid]} and {i} share extra_info.id {row.uid!r}; ids must be unique")
        seen[row.uid] = i
    return rows


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, str]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Chat messages (the parquet ``prompt`` column) → the token ids a rollout starts from: the tokenizer's chat
    template with the assistant generation prompt; plain text if it has none.

    ``tools`` (function declarations, ``rollout.tools.tool_schemas``) are listed by the template, as
    ``apply_chat_template(tools=...)`` renders them: the prompt of ``rollout.action_format=chat_template``.

    The rollout appends the model's tokens right after these ids, so the template must end where the assistant's
    turn begins (``add_generation_prompt=True``).

    Raises:
        ValueError: ``tools`` given to a tokenizer without a chat template.
    """
    msgs = [dict(m) for m in messages]
    if getattr(tokenizer, "chat_template", None):
        listed: list[dict[Any, Any] | Callable[..., Any]] | None = None if tools is None else [dict(t) for t in tools]
        out: Any = tokenizer.apply_chat_template(msgs, tools=listed, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers v5 returns a BatchEncoding
        return [int(i) for i in ids]
    if tools is not None:
        raise ValueError("the prompt lists tools, which needs a tokenizer with a chat template; this one has none")
    text = "\n".join(m["content"] for m in msgs) + "\n"
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


class PromptDataset:
    """Rows with their prompts tokenized by the policy's chat template.

    Args:
        rows: the rows.
        tokenizer: the policy's tokenizer.
        max_prompt_tokens: longest prompt allowed.
        drop_overlong: drop longer prompts (logged) instead of raising.
        tools: function declarations the template lists in every prompt (``rollout.tools.prompt_tools``: the
            ``chat_template`` action format); None for Search-R1's tags, whose protocol is in the prompt's text.
    """

    def __init__(
        self,
        rows: Sequence[PromptRow],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_tokens: int,
        drop_overlong: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        kept: list[tuple[PromptRow, tuple[int, ...]]] = []
        for row in rows:
            ids = tuple(encode_prompt(tokenizer, row.messages, tools))
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
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(len(self.dataset), generator=generator).tolist()

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
