"""A KV cache that grows in place: decode steps write into spare columns instead of copying the cache.

transformers' ``DynamicLayer`` appends each step's keys and values with ``torch.cat``, which copies the whole layer
cache on every decode step: for SmolLM2-135M at 32 rows and ~300 columns that is ~440 MB of copies per step (from
the shapes); removing them cut the rollout bench's decode time by a fifth
(docs/experiments/2026-11-27-rollout-cache-growth.md). ``GrowingLayer`` keeps each layer's
states in a buffer with ``SPARE_COLUMNS`` free columns after the last one, writes new states there and hands the
model views of the filled part; the buffer is reallocated (one copy) only when it is full, once per
``SPARE_COLUMNS`` decode steps.

Anything that assigns ``layer.keys`` / ``layer.values`` directly (``hf_session`` trims and merges batches that way)
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

    def _backed(self) -> bool:
        """Whether ``keys`` / ``values`` are still the views this layer made of its buffers."""
        return self._views is not None and self.keys is self._views[0] and self.values is self._views[1]

    def _rebuffer(self, filled: int, needed: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """New buffers of ``needed + SPARE_COLUMNS`` columns holding the current ``filled`` columns."""
        cap = needed + SPARE_COLUMNS
        k_buf = like_k.new_empty((*like_k.shape[:-2], cap, like_k.shape[-1]))
        v_buf = like_v.new_empty((*like_v.shape[:-2], cap, like_v.shape[-1]))
        if filled:
            assert self.keys is not None and self.values is not None
            k_buf[..., :filled, :] = self.keys
            v_buf[..., :filled, :] = self.values
        self._key_buf, self._value_buf = k_buf, v_buf

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (R, kv_heads, S, head_dim) states; return all keys and values so far (views of the buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.get_seq_length()
        needed = filled + key_states.shape[-2]
        assert self._key_buf is None or self._value_buf is not None
        if (
            not self._backed()
            or self._key_buf is None
            or self._value_buf is None
            or needed > self._key_buf.shape[-2]
            or self._key_buf.shape[0] != key_states.shape[0]
        ):
            self._rebuffer(filled, needed, key_states, value_states)
        assert self._key_buf is not None and self._value_buf is not None
        self._key_buf[..., filled:needed, :] = key_states
        self._value_buf[..., filled:needed, :] = value_states
        self.keys, self.values = self._key_buf[..., :needed, :], self._value_buf[..., :needed, :]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (buffers and their spare columns included)."""
        if self.get_seq_length() == 0:
            return
        if not self._backed() or self._key_buf is None or self._value_buf is None:
            super().batch_select_indices(indices)
            return
        filled = self.get_seq_length()
        self._key_buf, self._value_buf = self._key_buf[indices], self._value_buf[indices]
        self.keys, self.values = self._key_buf[..., :filled, :], self._value_buf[..., :filled, :]
        self._views = (self.keys, self.values)


def growing_cache(config: PretrainedConfig) -> DynamicCache:
    """``DynamicCache(config=config)`` with every plain ``DynamicLayer`` replaced by a ``GrowingLayer`` (sliding
    and other layer kinds are kept as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
