"""Micro-batches sized by samples or by padded tokens, and length-sorted passes.

A forward pass over a micro-batch is cut to the columns its rows use (``forward.used_columns``): its cost is its
rows times the longest prompt plus the longest response among them, its *padded tokens*. A token budget packs rows of
similar length together until the next one would cross it, so short rows share a pass and a long one is not padded
with others' columns. How a mini-batch is split does not change its loss: every micro-batch's loss is weighted by its
share of the mini-batch's tokens or sequences (``optimization.aggregation_weight``).
"""

from __future__ import annotations

import torch

from search_rl.batches import TrainBatch


def row_lengths(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens, response tokens) of each row; (B,) each."""
    p = batch.prompt_length
    return batch.attention_mask[:, :p].sum(-1), batch.response_attention_mask.sum(-1)


def padded_tokens(batch: TrainBatch) -> int:
    """Tokens a trimmed pass over ``batch`` processes, padding included: rows x (longest prompt + longest response)."""
    prompts, responses = row_lengths(batch)
    return len(batch) * (int(prompts.max()) + max(int(responses.max()), 1)) if len(batch) else 0


def micro_batches(batch: TrainBatch, size: int, max_tokens: int) -> list[TrainBatch]:
    """``batch`` split in order into micro-batches: of ``size`` rows when ``max_tokens`` is 0, else of as many
    consecutive rows as keep ``padded_tokens`` within ``max_tokens`` (a row longer than the budget goes alone). Sort
    the rows by length first for the budget to pack well."""
    if max_tokens <= 0:
        return batch.split_by_size(size)
    prompts, responses = (x.tolist() for x in row_lengths(batch))
    parts: list[TrainBatch] = []
    start, longest_prompt, longest_response = 0, 0, 1
    for row in range(len(batch)):
        p, r = max(longest_prompt, prompts[row]), max(longest_response, responses[row])
        if row > start and (row - start + 1) * (p + r) > max_tokens:
            parts.append(batch.select(torch.arange(start, row)))
            start, p, r = row, prompts[row], max(responses[row], 1)
        longest_prompt, longest_response = p, r
    if len(batch):
        parts.append(batch.select(torch.arange(start, len(batch))))
    return parts


def length_order(batch: TrainBatch) -> torch.Tensor:
    """Row order by total length (stable), so that consecutive micro-batches pad little; ``argsort`` of it restores
    the batch's order."""
    return torch.argsort(batch.attention_mask.sum(-1), stable=True)
