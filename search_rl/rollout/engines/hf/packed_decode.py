"""Decode attention without copying the KV cache per query head: a one-token query of a grouped-query model attends
per KV head, the query heads of a group packed as that head's query rows.

Before transformers 5.23, ``sdpa`` attention with a mask (a left-padded batch always has one) repeats every layer's
keys and values once per query head of a group on every decode step (``repeat_kv``): Qwen2.5-3B has 8 query heads
per KV head, so a 64-slot decode step over 512 columns writes and reads ~19 GB of copies besides reading the ~6 GB of
weights. transformers 5.23 packs the heads itself (``pack_gqa``); on older versions the HF engine registers
this function under ``PACKED_SDPA`` and selects it for its decode steps (``packed_decode``). Anything that is not a
one-token query with a mask shared by all heads goes to transformers' own ``sdpa`` unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations import sdpa_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "search_rl_packed_sdpa"
"""The attention implementation name this module registers with transformers."""

TRANSFORMERS_PACKS_GQA = hasattr(sdpa_attention, "pack_gqa")
"""transformers' own ``sdpa`` packs one-token grouped queries (5.23 and later): nothing to do."""


def packed_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract: query (B, H, S, D), key/value (B, KVH, L, D), mask (B, 1, S, L) or None;
    returns (B, S, H, D). A one-token query (S = 1) with KVH < H attends as (B, KVH, H / KVH, D) rows of its KV
    head's SDPA; everything else is transformers' ``sdpa_attention_forward``."""
    batch, heads, q_len, _ = query.shape
    kv_heads = key.shape[1]
    plain = (
        q_len != 1
        or kv_heads == heads
        or (attention_mask is not None and attention_mask.shape[1] != 1)
        or kwargs.get("position_bias") is not None
        or kwargs.get("s_aux") is not None
        or kwargs.get("softcap") is not None
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    packed = query.reshape(batch, kv_heads, heads // kv_heads, query.shape[-1])  # (B, KVH, G, D)
    out = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False
    )  # (B, KVH, G, Dv): head h = kv_head * G + g, as repeat_kv orders them
    return out.reshape(batch, 1, heads, value.shape[-1]), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # masks built as for sdpa (an unknown name gets none)


@contextmanager
def packed_decode(model: PreTrainedModel, enabled: bool = True) -> Iterator[None]:
    """Run the model's forwards inside with ``PACKED_SDPA`` attention, then restore its implementation. A no-op
    unless ``enabled`` and the model uses ``sdpa``."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if not enabled or before != "sdpa":
        yield
        return
    config._attn_implementation = PACKED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = before
