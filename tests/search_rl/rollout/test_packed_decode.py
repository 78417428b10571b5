"""Packed decode attention: a one-token grouped query attends per KV head with the same result as repeating the
keys and values per query head; both in-process engines decode the same tokens with it, and really call it.

Run: python -m pytest tests/search_rl/rollout/test_packed_decode.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from numerics import assert_reordered_close, logprob_scale, predicting_inputs
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from search_rl.datatypes import SamplingParams
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.hf.packed_decode import PACKED_SDPA, packed_decode, packed_sdpa_attention


class _Layer(torch.nn.Module):
    """What transformers' sdpa reads from an attention module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def _reference(query, key, value, mask, scaling):
    """Attention with the keys and values repeated per query head, by hand: (B, S, H, D)."""
    groups = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # (B, H, L, D)
    scores = query @ k.transpose(-1, -2) * scaling  # (B, H, S, L)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def _assert_same_attention(out, query, key, value, mask, scaling) -> None:
    """``out`` is the attention of ``_reference`` computed in another order (grouped or repeated heads, a fused
    kernel or matmuls). A score sums ``dim`` products, so it may move by ``2 dim eps`` times ``sum|q k|`` (at most
    ``max_abs_score``), which moves a softmax weight by as much relatively; the output then sums ``length`` weighted
    values. So it is off by at most ``2 (dim * max_abs_score + length) eps max|v|`` (tests/numerics.py)."""
    max_abs_score = float((query.abs() @ key.abs().repeat_interleave(query.shape[1] // key.shape[1], 1).mT).max())
    rounding_terms = math.ceil(query.shape[-1] * max_abs_score * scaling + key.shape[2])
    expected = _reference(query, key, value, mask, scaling)
    assert_reordered_close(out, expected, rounding_terms, scale=float(value.abs().max()))


def _inputs(seed: int, heads: int = 8, kv_heads: int = 2, q_len: int = 1, length: int = 19, dim: int = 16):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(3, heads, q_len, dim, generator=g)
    key, value = (torch.randn(3, kv_heads, length, dim, generator=g) for _ in range(2))
    visible = torch.rand(3, 1, q_len, length, generator=g) < 0.7
    visible[..., 0] = True  # every query sees at least one column
    return query, key, value, visible


@pytest.mark.parametrize("mask_kind", ["additive", "bool", "none"])
def test_one_token_grouped_query_matches_repeated_keys(mask_kind):
    query, key, value, visible = _inputs(seed=1)
    mask = {
        "additive": torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min),
        "bool": visible,
        "none": None,
    }[mask_kind]
    out, weights = packed_sdpa_attention(_Layer(4), query, key, value, mask, scaling=0.25)
    assert weights is None and out.shape == (3, 1, 8, 16)
    _assert_same_attention(out, query, key, value, mask, 0.25)


@pytest.mark.parametrize(("heads", "q_len"), [(2, 1), (8, 5)])
def test_other_shapes_are_transformers_sdpa(heads, q_len):
    """Ungrouped heads and multi-token queries take transformers' sdpa path, with the same result."""
    query, key, value, visible = _inputs(seed=2, heads=heads, q_len=q_len)
    out, _ = packed_sdpa_attention(_Layer(heads // 2), query, key, value, visible, scaling=0.25)
    _assert_same_attention(out, query, key, value, visible, 0.25)


def test_the_implementation_is_restored_even_when_the_forward_fails(tiny_model):
    assert tiny_model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), packed_decode(tiny_model):
        assert tiny_model.config._attn_implementation == PACKED_SDPA
        raise RuntimeError("boom")
    assert tiny_model.config._attn_implementation == "sdpa"
    with packed_decode(tiny_model, enabled=False):
        assert tiny_model.config._attn_implementation == "sdpa"


def test_the_hf_engine_decodes_the_same_tokens_through_packed_attention(tiny_model, tokenizer, monkeypatch):
    """The tiny model has 4 query heads over 2 KV heads; every decode step goes through the packed function (the
    prompts differ in length, so the HF engine's batch is padded and masked). The static engine's own forward packs
    grouped heads itself (``lean_decoder``, tested against the HF forward in ``test_lean_decoder.py``)."""
    engine_class = HFEngine
    calls = {"packed": 0}

    def counting(module, query, *args, **kwargs):
        calls["packed"] += query.shape[2] == 1
        return packed_sdpa_attention(module, query, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, PACKED_SDPA, counting)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("The capital of France is", "Hi there")]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    plain = engine_class(tiny_model, tokenizer)
    plain.packed_decode = False
    packed = engine_class(tiny_model, tokenizer)
    packed.packed_decode = True
    expected, got = plain.generate(prompts, params), packed.generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    for prompt, a, b in zip(prompts, got, expected, strict=True):  # attention over the sequence, in another order
        scale = logprob_scale(*predicting_inputs(tiny_model, prompt + list(b.token_ids), len(prompt)))
        n = len(prompt) + len(a.token_ids)
        assert_reordered_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), n, scale=scale)
    layers = tiny_model.config.num_hidden_layers
    assert calls["packed"] == layers * 7  # 7 decode steps (the first token comes from the prefill), every layer
    assert tiny_model.config._attn_implementation == "sdpa"
