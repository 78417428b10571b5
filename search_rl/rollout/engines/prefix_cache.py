"""Reuse of key/value states across engine calls: the next turn's prompt starts with the last turn's sequence.

A multi-turn rollout calls the engine once per turn with ``prompt + response so far``; without reuse, every turn
re-encodes the whole context (for SmolLM2 on CPU, most of a rollout's time). The HF engine stores each finished
sample's KV states (one (kv_heads, n, head_dim) pair per layer, ``n`` = tokens fed to the model) keyed by those
tokens; the next call looks up the longest stored key that prefixes a new prompt and only encodes the rest.

KV states at position ``t`` depend only on tokens ``<= t`` (causal attention), so any prefix of a stored entry is
valid for a prompt that shares that prefix. Entries live for one call (the next turn), and ``clear`` must be
called when the weights change (``HFEngine.update_weights`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer: (keys, values), each (kv_heads, n, head_dim)."""

MIN_COMMON_PREFIX_SAVING = 64
"""Token positions a call's common prompt prefix must save (rows beyond the first times its length) to be encoded
on its own: below that, its extra forward costs about what it saves."""


@dataclass
class PrefixStats:
    """Counters for logs and tests: prompts that reused a prefix, and tokens not re-encoded thanks to it."""

    hits: int = 0
    reused_tokens: int = 0
    common_tokens: int = 0
    """Of ``reused_tokens``: those a row took from its call's common prompt prefix (encoded once per call)."""


class PrefixStore:
    """Finished samples' KV states of the previous call, searchable by token prefix."""

    def __init__(self) -> None:
        self._entries: list[tuple[tuple[int, ...], KV]] = []
        self._next: list[tuple[tuple[int, ...], KV]] = []
        self.stats = PrefixStats()

    def lookup(self, prompt: Sequence[int]) -> tuple[int, KV | None]:
        """(tokens reusable, their KV) for ``prompt``; at least one prompt token is always left to encode."""
        best_len, best_kv = 0, None
        for key, kv in self._entries:
            n = min(len(key), len(prompt) - 1)
            if n > best_len and tuple(prompt[:n]) == key[:n]:
                best_len, best_kv = n, kv
        if best_kv is None:
            return 0, None
        return best_len, [(k[:, :best_len], v[:, :best_len]) for k, v in best_kv]

    def count(self, found: Sequence[tuple[int, KV | None]]) -> None:
        """Add the reuse a call actually applied (after ``balance_reuse``) to ``stats``."""
        for n, kv in found:
            if kv is not None and n > 0:
                self.stats.hits += 1
                self.stats.reused_tokens += n

    def add(self, tokens: Sequence[int], kv: KV) -> None:
        """Keep ``kv`` (states of exactly ``tokens``) for the next call."""
        self._next.append((tuple(tokens), kv))

    def rotate(self) -> None:
        """End of a call: the entries added during it become the searchable ones."""
        self._entries, self._next = self._next, []

    def clear(self) -> None:
        """Forget everything (weights changed)."""
        self._entries, self._next = [], []


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix that every prompt starts with."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for other in prompts[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return n


def balance_reuse(lengths: Sequence[int], found: Sequence[tuple[int, KV | None]]) -> list[tuple[int, KV | None]]:
    """Trim each row's reused prefix so that every row encodes as many new tokens as the row with the most.

    A left-padded batch computes ``max(new tokens)`` positions for every row whatever each row reuses, and its
    attention spans ``max(reused) + max(new)`` columns. Reusing at most ``length - max_new`` tokens per row keeps the
    computed positions the same and shrinks the span to ``max(length)``: a batch where one prompt has no stored
    prefix (the first turn beside a repeated prompt) costs what it costs without reuse, not more. ``lengths``:
    each row's prompt length; ``found``: (tokens reusable, their KV) per row, from ``PrefixStore.lookup``.
    """
    new = max(n - c for n, (c, _) in zip(lengths, found, strict=True))
    out: list[tuple[int, KV | None]] = []
    for n, (c, kv) in zip(lengths, found, strict=True):
        keep = min(c, max(0, n - new))
        if kv is None or keep == 0:
            out.append((0, None))
        elif keep == c:
            out.append((c, kv))
        else:
            out.append((keep, [(k[:, :keep], v[:, :keep]) for k, v in kv]))
    return out
