"""A pre-allocated KV cache of fixed slots for the static engine: one slot per sequence, one column per position.

Row ``s`` of every layer's (slots, kv_heads, length, head_dim) buffer holds one sequence, token ``t`` at column
``t``: no padding inside a slot, so a slot can be refilled with a new sequence while the others keep decoding, and
the decode step's tensors keep their shapes and addresses from step to step (what a CUDA graph replays). The last
column is scratch: padding queries and idle slots write there, and no real query ever attends to it.

The model's attention layers call ``update`` with new keys/values; where they go is the ``WritePlan`` the engine
sets before each forward (the decode graph captures a plan whose tensors it updates in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class WritePlan:
    """Where one forward writes and what it reads.

    Attributes:
        rows: (R,) slot of each batch row.
        cols: (R, S) cache column of each new token (its position; padding points at the scratch column).
        length: columns read back (a prefix of the buffer, scratch column included).
        dense: the rows are slots ``0..R-1`` in order, so reads are views (the decode step), not gathers.
    """

    rows: torch.Tensor
    cols: torch.Tensor
    length: int
    dense: bool


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, (slots, kv_heads, length, head_dim) each, written where the plan says."""

    is_compileable = False
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, owner: SlotCache) -> None:
        super().__init__()
        self.keys, self.values, self.owner = keys, values, owner
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers are allocated up front."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.owner.plan
        assert plan is not None and self.keys is not None and self.values is not None, "set a WritePlan first"
        rows = plan.rows[:, None]  # (R, 1)
        # Advanced indices split by a slice put their dims first: the target is (R, S, kv_heads, head_dim).
        self.keys[rows, :, plan.cols] = key_states.transpose(1, 2).to(self.keys.dtype)
        self.values[rows, :, plan.cols] = value_states.transpose(1, 2).to(self.values.dtype)
        if plan.dense:
            n = plan.rows.shape[0]
            return self.keys[:n, :, : plan.length], self.values[:n, :, : plan.length]
        return self.keys[plan.rows, :, : plan.length], self.values[plan.rows, :, : plan.length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        assert self.keys is not None
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        raise NotImplementedError("SlotCache: sequence lengths differ per slot; pass position_ids explicitly")

    def get_max_length(self) -> int:
        assert self.keys is not None
        return self.keys.shape[2]


class SlotCache(Cache):
    """Per-layer slot buffers behind transformers' ``Cache`` interface (what a model's ``forward`` takes).

    Args:
        config: the model's config (layers, KV heads, head size).
        slots: sequences held at once.
        length: columns per slot, the scratch column included.
        dtype: the model's dtype.
        device: the model's device.
    """

    def __init__(
        self, config: PretrainedConfig, slots: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        text = config.get_text_config(decoder=True)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        shape = (slots, kv_heads, length, head_dim)
        self.plan: WritePlan | None = None
        layers: list[Any] = [
            SlotLayer(
                torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device), self
            )
            for _ in range(int(text.num_hidden_layers))
        ]
        super().__init__(layers=layers)
        self.slots, self.length = slots, length

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s (keys, values) buffers."""
        slot_layer = self.layers[layer]
        assert isinstance(slot_layer, SlotLayer) and slot_layer.keys is not None and slot_layer.values is not None
        return slot_layer.keys, slot_layer.values

    def copy_slot(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` columns of slot ``src`` into slot ``dst`` (a shared prompt's states)."""
        for i in range(len(self.layers)):
            keys, values = self.kv(i)
            keys[dst, :, :n] = keys[src, :, :n]
            values[dst, :, :n] = values[src, :, :n]

    def read_slot(self, slot: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of slot ``slot``'s first ``n`` columns, per layer (kv_heads, n, head_dim) (for the prefix store)."""
        return [(k[slot, :, :n].clone(), v[slot, :, :n].clone()) for k, v in map(self.kv, range(len(self.layers)))]

    def write_slot(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put stored states (per layer (kv_heads, n, head_dim)) in the first ``n`` columns of slot ``slot``."""
        for i, (k, v) in enumerate(kv):
            keys, values = self.kv(i)
            keys[slot, :, : k.shape[1]] = k
            values[slot, :, : v.shape[1]] = v
