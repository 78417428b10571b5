"""Batch containers: select / split / concat / repeat_interleave over tensors, per-sample tuples and meta.

Run: python -m pytest tests/search_rl/test_batches.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.batches import BatchMeta, PromptBatch, TrainBatch


def _prompts(n: int) -> PromptBatch:
    return PromptBatch(
        prompt_ids=tuple((i, i + 1) for i in range(n)),
        uids=tuple(f"u{i}" for i in range(n)),
        data_sources=("nq",) * n,
        targets=tuple((f"a{i}",) for i in range(n)),
        questions=tuple(f"q{i}" for i in range(n)),
        row_indices=tuple(range(n)),
    )


def _train(n: int, t: int = 3) -> TrainBatch:
    ids = torch.arange(n * (2 + t)).view(n, 2 + t)
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(2 + t).expand(n, -1).clone(),
        response_ids=ids[:, 2:],
        response_mask=torch.ones(n, t, dtype=torch.long),
        rollout_logprobs=torch.zeros(n, t),
        uids=tuple(f"u{i}" for i in range(n)),
        data_sources=("nq",) * n,
        meta=BatchMeta(step=7, weight_version=6),
    )


def test_repeat_interleave_keeps_groups_adjacent():
    batch = _prompts(2).repeat_interleave(3)
    assert batch.uids == ("u0", "u0", "u0", "u1", "u1", "u1")
    assert batch.prompt_ids[3] == (1, 2) and len(batch) == 6


def test_select_by_indices_and_boolean_mask():
    batch = _train(4)
    assert batch.select([2, 0]).uids == ("u2", "u0")
    assert torch.equal(batch.select([2, 0]).input_ids, batch.input_ids[[2, 0]])
    picked = batch.select(torch.tensor([True, False, False, True]))
    assert picked.uids == ("u0", "u3") and picked.meta == BatchMeta(step=7, weight_version=6)


def test_split_is_near_equal_and_concat_inverts_it():
    batch = _train(5)
    parts = batch.split(2)
    assert [len(p) for p in parts] == [2, 3]
    assert [len(p) for p in batch.split(8)] == [1] * 5  # never an empty shard
    again = TrainBatch.concat(parts)
    assert torch.equal(again.input_ids, batch.input_ids) and again.uids == batch.uids
    assert [len(p) for p in batch.split_by_size(2)] == [2, 2, 1]


def test_inconsistent_sizes_and_missing_fields_are_errors():
    with pytest.raises(ValueError, match="disagree on batch size"):
        _train(2).replace(uids=("only-one",))
    with pytest.raises(ValueError, match="missing \\['advantages'\\]"):
        _train(2).require("advantages")
    with pytest.raises(ValueError, match="set in some batches"):
        TrainBatch.concat([_train(1).replace(values=torch.zeros(1, 3)), _train(1)])
