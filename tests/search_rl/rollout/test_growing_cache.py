"""The in-place growing KV cache: the same states as transformers' ``DynamicCache`` through prefill, decode steps,
row selection, direct assignment and reallocation, without copying the cache on every step.

Run: python -m pytest tests/search_rl/rollout/test_growing_cache.py -q
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from search_rl.models import build_tiny_model
from search_rl.rollout.engines.decoding import fill_holes
from search_rl.rollout.engines.hf.growing_cache import SPARE_COLUMNS, GrowingLayer, growing_cache


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
    for cache in (ref, grown):  # what the HF session does when it trims a batch's leading columns
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


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([t.new_zeros((*t.shape[:2], width - t.shape[2], t.shape[3])), t], dim=2)


def test_fill_holes_moves_only_rows_from_beyond_the_kept_count():
    assert fill_holes([0, 2, 3], 4) == [0, 3, 2]  # row 1 left: row 3 takes its place, 0 and 2 stay
    assert fill_holes([1, 2], 3) == [2, 1]
    assert fill_holes([0, 1], 4) == [0, 1]
    assert fill_holes([4], 5) == [4]


def test_selecting_rows_moves_only_the_rows_that_change_place():
    layer, gen = GrowingLayer(), torch.Generator().manual_seed(2)
    keys, values = layer.update(*_states(gen, 5, 6))
    ref_k, ref_v = keys.clone(), values.clone()
    buffer = keys.data_ptr()
    order = fill_holes([0, 2, 4], 5)  # [0, 4, 2]
    layer.batch_select_indices(torch.tensor(order))
    assert layer.keys.data_ptr() == buffer  # the same buffer: rows 1 and 3 were overwritten in place
    assert torch.equal(layer.keys, ref_k[order]) and torch.equal(layer.values, ref_v[order])
    k, v = _states(gen, 3, 1)  # a decode step after it writes into the same buffer
    keys, values = layer.update(k, v)
    assert keys.data_ptr() == buffer
    assert torch.equal(keys, torch.cat([ref_k[order], k], dim=2)) and torch.equal(values[:, :, -1:], v)
    layer.batch_select_indices(torch.tensor([2, 0]))  # an order that is not hole-filling: gathered, still right
    assert torch.equal(layer.keys, torch.cat([ref_k[order], k], dim=2)[[2, 0]])


def test_dropping_leading_columns_keeps_the_buffer():
    layer, gen = GrowingLayer(), torch.Generator().manual_seed(3)
    keys, _ = layer.update(*_states(gen, 2, 8))
    ref, buffer = keys.clone(), keys.data_ptr()
    layer.drop_leading_columns(3)
    assert torch.equal(layer.keys, ref[:, :, 3:]) and layer.get_seq_length() == 5
    k, v = _states(gen, 2, 1)
    keys, values = layer.update(k, v)
    assert keys.untyped_storage().data_ptr() == buffer  # the same buffer, from its fourth column
    assert torch.equal(keys, torch.cat([ref[:, :, 3:], k], dim=2)) and layer.get_seq_length() == 6


def test_appended_rows_are_left_padded_to_the_wider_side():
    gen = torch.Generator().manual_seed(4)
    for first_cols, cut, new_cols in [(9, 0, 4), (9, 4, 7), (5, 0, 8)]:
        layer = GrowingLayer()
        keys, values = layer.update(*_states(gen, 4, first_cols))
        layer.batch_select_indices(torch.tensor(fill_holes([1, 3], 4)))  # two rows leave: free rows in the buffer
        layer.drop_leading_columns(cut)
        mine_k, mine_v = layer.keys.clone(), layer.values.clone()
        buffer = layer._key_buf.data_ptr()
        new_k, new_v = _states(gen, 2, new_cols)
        layer.append_rows(new_k, new_v)
        width = max(mine_k.shape[2], new_cols)
        want_k = torch.cat([_left_pad(mine_k, width), _left_pad(new_k, width)])
        want_v = torch.cat([_left_pad(mine_v, width), _left_pad(new_v, width)])
        assert torch.equal(layer.keys, want_k) and torch.equal(layer.values, want_v)
        in_place = new_cols <= first_cols  # room on the left for the wider side, and two free rows
        assert (layer._key_buf.data_ptr() == buffer) is in_place, (first_cols, cut, new_cols)
        k, v = _states(gen, 4, 1)
        keys, _ = layer.update(k, v)  # decoding goes on from the merged rows
        assert torch.equal(keys, torch.cat([want_k, k], dim=2))
