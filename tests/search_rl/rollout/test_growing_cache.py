"""The in-place growing KV cache: the same states as transformers' ``DynamicCache`` through prefill, decode steps,
row selection, direct assignment and reallocation, without copying the cache on every step.

Run: python -m pytest tests/search_rl/rollout/test_growing_cache.py -q
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from search_rl.models import build_tiny_model
from search_rl.rollout.engines.growing_cache import SPARE_COLUMNS, GrowingLayer, growing_cache


def _states(gen: torch.Generator, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, 2, cols, 4, generator=gen), torch.randn(rows, 2, cols, 4, generator=gen)


def _same(a: DynamicCache, b: DynamicCache) -> None:
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_growing_cache_holds_what_dynamic_cache_holds(tokenizer):
    config = build_tiny_model(tokenizer).config
    ref, grown = DynamicCache(config=config), growing_cache(config)
    assert all(type(layer) is GrowingLayer for layer in grown.layers)
    gen = torch.Generator().manual_seed(0)

    def step(cols: int, rows: int) -> None:
        for layer in range(len(ref.layers)):
            k, v = _states(gen, rows, cols)
            out_ref, out_grown = ref.update(k, v, layer), grown.update(k, v, layer)
            assert torch.equal(out_ref[0], out_grown[0]) and torch.equal(out_ref[1], out_grown[1])

    step(7, rows=4)  # prefill
    for _ in range(3):
        step(1, rows=4)
    sel = torch.tensor([0, 2, 3])
    ref.batch_select_indices(sel)
    grown.batch_select_indices(sel)
    _same(ref, grown)
    for _ in range(SPARE_COLUMNS + 2):  # past the spare columns: reallocated once, still equal
        step(1, rows=3)
    _same(ref, grown)
    for cache in (ref, grown):  # what hf_session does when it trims a batch's leading columns
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, 5:], layer.values[:, :, 5:]
    step(1, rows=3)
    _same(ref, grown)
    assert grown.get_seq_length() == ref.get_seq_length() == 7 + 3 + SPARE_COLUMNS + 2 + 1 - 5


def test_decode_steps_write_into_the_same_buffer():
    layer = GrowingLayer()
    gen = torch.Generator().manual_seed(1)
    layer.update(*_states(gen, 2, 5))
    buffer = layer.keys.data_ptr()
    for _ in range(SPARE_COLUMNS):
        keys, _ = layer.update(*_states(gen, 2, 1))
        assert keys.data_ptr() == buffer  # no copy: a view of the same storage
    keys, _ = layer.update(*_states(gen, 2, 1))
    assert keys.data_ptr() != buffer and keys.shape[2] == 5 + SPARE_COLUMNS + 1  # full: one reallocation
