"""A KV cache that grows in place: decode steps write into spare columns instead of copying the cache.

transformers' ``DynamicLayer`` appends each step's keys and values with ``torch.cat``, which copies the whole layer
cache on every decode step: for SmolLM2-135M at 32 rows and ~300 columns that is ~440 MB of copies per step (from
the shapes); removing them cut the rollout bench's decode time by a fifth
(docs/experiments/2026-11-27-rollout-cache-growth.md). ``GrowingLayer`` keeps each layer's
states in a buffer with ``SPARE_COLUMNS`` free columns after the last one, writes new states there and hands the
model views of the filled part; the buffer is reallocated (one copy) only when it is full, once per
``SPARE_COLUMNS`` decode steps.

Anything that assigns ``layer.keys`` / ``layer.values`` directly (``session`` trims and merges batches that way)
stays correct: the next ``update`` sees that the tensors are no longer its buffer's views and starts a new buffer
from them.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 128
"""Free columns a layer's buffer gets beyond what it holds each time it is (re)allocated."""


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of a buffer with spare columns (see the module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows = 0  # live rows: the buffers may hold more (rows that left, kept for joiners)
        self._start = 0  # first live column: columns before it were cut (``drop_leading_columns``)

    def _backed(self) -> bool:
        """Whether ``keys`` / ``values`` are still the views this layer made of its buffers."""
        return self._views is not None and self.keys is self._views[0] and self.values is self._views[1]

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The buffers if ``keys`` / ``values`` are still their views, else None."""
        if not self._backed() or self._key_buf is None or self._value_buf is None:
            return None
        return self._key_buf, self._value_buf

    def _show(self, rows: int, filled: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Point ``keys`` / ``values`` at the first ``rows`` rows and ``filled`` live columns of the buffers."""
        assert self._key_buf is not None and self._value_buf is not None
        cols = slice(self._start, self._start + filled)
        views = self._key_buf[:rows, :, cols], self._value_buf[:rows, :, cols]
        self.keys, self.values = views
        self._views, self._rows = views, rows
        return views

    def _rebuffer(self, filled: int, needed: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """New buffers of ``needed + SPARE_COLUMNS`` columns holding the current ``filled`` columns."""
        cap = needed + SPARE_COLUMNS
        k_buf = like_k.new_empty((*like_k.shape[:-2], cap, like_k.shape[-1]))
        v_buf = like_v.new_empty((*like_v.shape[:-2], cap, like_v.shape[-1]))
        if filled:
            assert self.keys is not None and self.values is not None
            k_buf[:, :, :filled] = self.keys
            v_buf[:, :, :filled] = self.values
        self._key_buf, self._value_buf, self._start = k_buf, v_buf, 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (R, kv_heads, S, head_dim) states; return all keys and values so far (views of the buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled, rows = self.get_seq_length(), key_states.shape[0]
        needed = filled + key_states.shape[-2]
        bufs = self._buffers()
        if bufs is None or rows != self._rows or self._start + needed > bufs[0].shape[-2]:
            self._rebuffer(filled, needed, key_states, value_states)
        assert self._key_buf is not None and self._value_buf is not None
        self._key_buf[:rows, :, self._start + filled : self._start + needed] = key_states
        self._value_buf[:rows, :, self._start + filled : self._start + needed] = value_states
        return self._show(rows, needed)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``, in that order. When every row that changes place comes from beyond the kept
        count (as ``decoding.fill_holes`` orders them), only those rows are copied, within the buffers; otherwise the
        buffers are gathered anew."""
        if self.get_seq_length() == 0:
            return
        bufs = self._buffers()
        if bufs is None:
            super().batch_select_indices(indices)
            return
        filled, order = self.get_seq_length(), indices.tolist()
        moves = [(dst, src) for dst, src in enumerate(order) if src != dst]
        if all(src >= len(order) for _, src in moves):
            if moves:
                dst = torch.tensor([d for d, _ in moves], device=indices.device)
                src = torch.tensor([s for _, s in moves], device=indices.device)
                cols = slice(self._start, self._start + filled)
                for buf in bufs:
                    buf[dst, :, cols] = buf[src, :, cols]
        else:
            self._key_buf, self._value_buf = bufs[0][indices], bufs[1][indices]
        self._show(len(order), filled)

    def drop_leading_columns(self, n: int) -> None:
        """Forget the first ``n`` columns of every row (no copy when backed by buffers)."""
        if n == 0:
            return
        if self._buffers() is None:
            assert self.keys is not None and self.values is not None
            self.keys, self.values = self.keys[:, :, n:], self.values[:, :, n:]
            return
        filled = self.get_seq_length()
        self._start += n
        self._show(self._rows, filled - n)

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows after the live ones. Both sides are left-padded with zeros to the wider of the two widths; the
        new rows are written into the buffers' free rows and columns where they fit, else both are copied into new
        buffers."""
        filled, width, rows, new = self.get_seq_length(), keys.shape[-2], self._rows, keys.shape[0]
        bufs = self._buffers()
        if bufs is not None and rows + new <= bufs[0].shape[0] and width <= filled + self._start:
            shift = max(width - filled, 0)  # columns this layer's rows gain on the left
            if shift:
                for buf in bufs:
                    buf[:rows, :, self._start - shift : self._start] = 0
                self._start -= shift
            full = filled + shift
            for buf, states in zip(bufs, (keys, values), strict=True):
                buf[rows : rows + new, :, self._start : self._start + full - width] = 0
                buf[rows : rows + new, :, self._start + full - width : self._start + full] = states
            self._show(rows + new, full)
            return
        assert self.keys is not None and self.values is not None
        old_rows = self.keys.shape[0]
        full = max(filled, width)
        shape = (old_rows + new, keys.shape[1], full + SPARE_COLUMNS, keys.shape[-1])
        k_buf, v_buf = keys.new_zeros(shape), values.new_zeros(shape)
        for buf, mine, states in ((k_buf, self.keys, keys), (v_buf, self.values, values)):
            buf[:old_rows, :, full - filled : full] = mine
            buf[old_rows:, :, full - width : full] = states
        self._key_buf, self._value_buf, self._start = k_buf, v_buf, 0
        self._show(old_rows + new, full)


def growing_cache(config: PretrainedConfig) -> DynamicCache:
    """``DynamicCache(config=config)`` with every plain ``DynamicLayer`` replaced by a ``GrowingLayer`` (sliding
    and other layer kinds are kept as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
