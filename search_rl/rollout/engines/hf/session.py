"""Continuous batching for the HF engine: sequences join the running batch while it decodes and leave as each
finishes, so a multi-turn rollout never waits for the slowest sequence of a turn.

The running batch is one left-padded cache of ``GrowingLayer`` s (as in ``HFEngine.generate``). Joining sequences
are encoded on their own (reusing what the session computed for their previous turn, or the engine's prefix store),
then written into the running cache's free rows, both sides left-padded to the same width. A row that finishes is
replaced by the last rows (only those are copied), and columns no running row attends to any more are cut from the
left without a copy. Every sequence samples from its own seeded stream (one uniform draw per token), so its
tokens do not depend on which sequences shared its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from transformers import DynamicCache, PreTrainedModel

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.rollout.engines.base import check_generate_args
from search_rl.rollout.engines.decoding import (
    LogitsProcessor,
    StopTails,
    fill_holes,
    finish_reason,
    row_states,
    sample_tokens,
)
from search_rl.rollout.engines.hf.growing_cache import GrowingLayer
from search_rl.rollout.engines.prefix_cache import KV, PrefixStore


class SessionHost(Protocol):
    """What a session needs of its engine (``HFEngine``): the model and its settings, the prefix store, and the
    engine's prefill and one-step forward over a left-padded ``growing_cache``."""

    model: PreTrainedModel
    cfg: HFEngineConfig
    prefix: PrefixStore
    logits_processor: LogitsProcessor | None

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def stop_tails(self, stops: tuple[str, ...]) -> StopTails: ...

    def prefill(
        self, prompts: list[list[int]], found: list[tuple[int, KV | None]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]: ...

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> torch.Tensor: ...


@dataclass
class _Seq:
    """One submitted sequence: its prompt, limit, sampling stream and what it has generated."""

    key: int
    prompt: list[int]
    limit: int
    gen: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)


@dataclass
class _Batch:
    """The running rows: their sequences, left-padded cache and attention, positions and the next input token."""

    seqs: list[_Seq]
    cache: DynamicCache
    attention: torch.Tensor  # (R, W) 1 = real column
    last_pos: torch.Tensor  # (R,) position of each row's newest cached token
    next_tok: torch.Tensor  # (R,) sampled, not yet fed


class HFSession:
    """A ``DecodeSession`` over an ``HFEngine`` (``engine.open_session(params)``); at most
    ``engine.cfg.max_batch_size`` sequences decode at once, the rest wait in submission order."""

    def __init__(self, engine: SessionHost, params: SamplingParams) -> None:
        self.engine, self.params = engine, params
        self._waiting: list[_Seq] = []
        self._batch: _Batch | None = None
        self._kept: dict[int, tuple[tuple[int, ...], KV]] = {}  # key -> (tokens fed, their states)
        self._stops = engine.stop_tails(params.stop)

    @property
    def pending(self) -> int:
        return len(self._waiting) + (len(self._batch.seqs) if self._batch is not None else 0)

    def submit(self, key: int, prompt: Sequence[int], max_new_tokens: int, seed: int | None) -> None:
        check_generate_args([prompt], self.params, [max_new_tokens], self.engine.max_model_len)
        gen = None
        if seed is not None and not self.params.greedy:
            gen = torch.Generator().manual_seed(seed)
        self._waiting.append(_Seq(key, list(prompt), max_new_tokens, gen))

    def step(self) -> list[tuple[int, Generated]]:
        model = self.engine.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                return self._step()
        finally:
            model.train(was_training)

    def _step(self) -> list[tuple[int, Generated]]:
        done: list[tuple[int, Generated]] = []
        if self._batch is not None:
            b = self._batch
            b.attention = torch.cat([b.attention, b.attention.new_ones((len(b.seqs), 1))], dim=1)
            b.last_pos = b.last_pos + 1
            logits = self.engine.forward(b.next_tok[:, None], b.attention, b.last_pos[:, None], b.cache)
            self._batch = self._sample(b, logits, done)
        room = self.engine.cfg.max_batch_size - (len(self._batch.seqs) if self._batch is not None else 0)
        if self._waiting and room > 0:
            joining, self._waiting = self._waiting[:room], self._waiting[room:]
            joined = self._admit(joining, done)
            if joined is not None:
                self._batch = joined if self._batch is None else _merge(self._batch, joined)
        return done

    def _admit(self, seqs: list[_Seq], done: list[tuple[int, Generated]]) -> _Batch | None:
        """Encode joining sequences (reusing their previous turn's states) and sample their first tokens."""
        found: list[tuple[int, KV | None]] = []
        for s in seqs:
            kept = self._kept.pop(s.key, None)
            if not self.engine.cfg.prefix_cache:
                found.append((0, None))
            elif kept is not None and len(kept[0]) < len(s.prompt) and tuple(s.prompt[: len(kept[0])]) == kept[0]:
                found.append((len(kept[0]), kept[1]))
            else:
                found.append(self.engine.prefix.lookup(s.prompt))
        logits, attention, last_pos, cache = self.engine.prefill([s.prompt for s in seqs], found)
        b = _Batch(seqs, cache, attention, last_pos, last_pos.new_zeros(len(seqs)))
        return self._sample(b, logits, done)

    def _sample(self, b: _Batch, logits: torch.Tensor, done: list[tuple[int, Generated]]) -> _Batch | None:
        """Sample one token per row, return finished rows in ``done`` and the batch without them (None: empty)."""
        params, engine = self.params, self.engine
        if engine.logits_processor is not None:
            logits = engine.logits_processor([s.prompt for s in b.seqs], [s.tokens for s in b.seqs], logits)
        uniforms = None
        if not params.greedy:
            uniforms = torch.stack([torch.rand((), generator=s.gen) for s in b.seqs])  # (R,)
        next_tok, next_lp = sample_tokens(logits, params, None, uniforms)  # (R,), (R,)
        for s, t, lp in zip(b.seqs, next_tok.tolist(), next_lp.tolist(), strict=True):
            s.tokens.append(t)
            s.logps.append(lp)
        tails = self._stops.tails([s.tokens for s in b.seqs])
        keep: list[int] = []
        for row, s in enumerate(b.seqs):
            reason, stop_str = finish_reason(
                s.tokens[-1], tails[row], params.stop, len(s.tokens), s.limit, engine.eos_token_ids
            )
            if reason is None:
                keep.append(row)
                continue
            lp = tuple(s.logps) if params.logprobs else None
            done.append((s.key, Generated(tuple(s.tokens), reason, stop_str, lp)))
            if engine.cfg.prefix_cache:  # its next turn starts with these tokens
                fed = s.prompt + s.tokens[:-1]
                self._kept[s.key] = (tuple(fed), row_states(b.cache, b.attention, row, len(fed)))
        if not keep:
            return None
        if len(keep) < len(b.seqs):
            order = fill_holes(keep, len(b.seqs))  # rows' order is free here: each samples from its own stream
            sel = torch.tensor(order, device=b.attention.device)
            b.cache.batch_select_indices(sel)
            b.seqs = [b.seqs[r] for r in order]
            b.attention, b.last_pos, next_tok = b.attention[sel], b.last_pos[sel], next_tok[sel]
            _trim(b)
        b.next_tok = next_tok
        return b


def _trim(b: _Batch) -> None:
    """Cut the leading columns that no row attends to (they were padding for rows that left)."""
    used = b.attention.any(dim=0).nonzero()
    start = int(used[0]) if used.numel() else 0
    if start == 0:
        return
    b.attention = b.attention[:, start:]
    for layer in _layers(b.cache):
        layer.drop_leading_columns(start)


def _merge(a: _Batch, b: _Batch) -> _Batch:
    """One batch of ``a``'s rows then ``b``'s, both left-padded to the wider cache (written into ``a``'s buffers
    where they have room)."""
    width = max(a.attention.shape[1], b.attention.shape[1])

    def pad(t: torch.Tensor) -> torch.Tensor:
        missing = width - t.shape[1]
        return t if missing == 0 else torch.cat([t.new_zeros((t.shape[0], missing)), t], dim=1)

    for la, lb in zip(_layers(a.cache), _layers(b.cache), strict=True):
        assert lb.keys is not None and lb.values is not None
        la.append_rows(lb.keys, lb.values)
    return _Batch(
        a.seqs + b.seqs,
        a.cache,
        torch.cat([pad(a.attention), pad(b.attention)], dim=0),
        torch.cat([a.last_pos, b.last_pos]),
        torch.cat([a.next_tok, b.next_tok]),
    )


def _layers(cache: DynamicCache) -> list[GrowingLayer]:
    """The cache's layers, each holding (R, kv_heads, W, head_dim) keys and values: ``GrowingLayer`` s, as
    ``HFEngine._encode`` builds every session cache with ``growing_cache`` (``supports_sessions`` checked that the
    model's layers are plain ``DynamicLayer`` s)."""
    layers = cache.layers
    assert all(isinstance(layer, GrowingLayer) for layer in layers), "session caches come from growing_cache"
    return cast(list[GrowingLayer], layers)
