"""A pre-allocated KV cache of fixed slots for the static engine: one slot per sequence, one column per position.

Row ``s`` of every layer's (slots, kv_heads, length, head_dim) buffer holds one sequence, token ``t`` at column
``t``: no padding inside a slot, so a slot can be refilled with a new sequence while the others keep decoding, and
the decode step's tensors keep their shapes and addresses from step to step (what a CUDA graph replays). The last
column is scratch: padding queries write there, and no real query ever attends to it.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from search_rl.rollout.engines.prefix_cache import KV


class SlotCache:
    """Per-layer slot buffers (``LeanDecoder.forward`` writes and reads them through ``kv``).

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
        self._layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(int(text.num_hidden_layers))
        ]
        self.slots, self.length = slots, length

    @property
    def scratch(self) -> int:
        """The column padding writes to."""
        return self.length - 1

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s (keys, values) buffers, (slots, kv_heads, length, head_dim) each."""
        return self._layers[layer]

    def copy_slot(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` columns of slot ``src`` into slot ``dst`` (a shared prompt's states, or a slot moved
        into a freed one)."""
        for keys, values in self._layers:
            keys[dst, :, :n] = keys[src, :, :n]
            values[dst, :, :n] = values[src, :, :n]

    def read_slot(self, slot: int, n: int) -> KV:
        """Copies of slot ``slot``'s first ``n`` columns, per layer (kv_heads, n, head_dim) (for the prefix store)."""
        return [(k[slot, :, :n].clone(), v[slot, :, :n].clone()) for k, v in self._layers]

    def write_slot(self, slot: int, kv: KV) -> None:
        """Put stored states (per layer (kv_heads, n, head_dim)) in the first ``n`` columns of slot ``slot``."""
        for (keys, values), (k, v) in zip(self._layers, kv, strict=True):
            keys[slot, :, : k.shape[1]] = k
            values[slot, :, : v.shape[1]] = v
