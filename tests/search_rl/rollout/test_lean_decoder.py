"""The static engine's lean forward: the HF forward's logits for Llama and Qwen2 (float32, prefill and decode, tied and
untied heads, attention and MLP biases), fused projections that stay views of the HF parameters, and refusals of the
models it does not model (sliding windows, soft-capping, other families).

Run: python -m pytest tests/search_rl/rollout/test_lean_decoder.py -q
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from search_rl.rollout.engines.lean_decoder import LeanDecoder, check_supported
from search_rl.rollout.engines.slot_cache import SlotCache

VOCAB = 300
LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-5}
"""Both forwards compute the same float32 function with other kernels (fused q/k/v and gate/up matmuls, grouped
heads packed instead of repeated), so logits of |x| ~ 1 differ by a few roundings per layer: measured <= 3e-7 at
2 layers. 1e-5 bounds that with margin at any blocking a CPU's BLAS picks, while a wrong position, mask or head
order moves logits by 1e-2 or more."""


def _llama(tied: bool = True, bias: bool = False) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        attention_bias=bias,
        mlp_bias=bias,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _qwen2(**overrides) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        **overrides,
    )
    torch.manual_seed(1)
    return Qwen2ForCausalLM(cfg).eval()


MODELS = {
    "llama-tied": lambda: _llama(),
    "llama-untied-bias": lambda: _llama(tied=False, bias=True),
    "qwen2": lambda: _qwen2(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_prefill_and_decode_give_the_hf_forwards_logits(name):
    """Three prompts prefilled together (left-padded, into slots out of order), then two decode steps; every row's
    last logits are those of a plain forward over its whole sequence."""
    model, reference = MODELS[name](), MODELS[name]()
    decoder = LeanDecoder(model, 257)
    cache = SlotCache(model.config, 4, 64, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 2)]
    slots = [2, 0, 3]
    width = max(map(len, seqs))
    ids = torch.zeros(3, width, dtype=torch.long)
    pos = torch.zeros(3, width, dtype=torch.long)
    cols = torch.full((3, width), cache.scratch)
    for r, s in enumerate(seqs):
        ids[r, width - len(s) :], pos[r, width - len(s) :] = torch.tensor(s), torch.arange(len(s))
        cols[r, width - len(s) :] = torch.arange(len(s))
    with torch.no_grad():
        logits = decoder.forward(ids, pos, cache, torch.tensor(slots), cols, width)
        for r, s in enumerate(seqs):
            torch.testing.assert_close(logits[r], reference(input_ids=torch.tensor([s])).logits[0, -1], **LOGITS_TOL)
        for _ in range(2):  # decode: slots 0..3 dense (slot 1 idle, writing the scratch column)
            new = torch.randint(0, VOCAB, (3,), generator=gen).tolist()
            tok = torch.zeros(4, 1, dtype=torch.long)
            at = torch.full((4, 1), cache.scratch)
            for r, (s, slot) in enumerate(zip(seqs, slots, strict=True)):
                tok[slot, 0], at[slot, 0] = new[r], len(s)
                s.append(new[r])
            logits = decoder.forward(tok, at, cache, None, at, max(map(len, seqs)))
            for s, slot in zip(seqs, slots, strict=True):
                expected = reference(input_ids=torch.tensor([s])).logits[0, -1]
                torch.testing.assert_close(logits[slot], expected, **LOGITS_TOL)


def test_fused_projections_are_views_of_the_hf_parameters():
    """After fusing, the HF model computes what it did, an in-place update of a projection reaches the fused weight,
    and a second decoder over the same model fuses nothing again."""
    model = _qwen2()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        decoder = LeanDecoder(model, 257)
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
        attn = model.model.layers[0].self_attn
        attn.k_proj.weight.data.copy_(torch.ones_like(attn.k_proj.weight))
        q_rows = attn.q_proj.weight.shape[0]
        assert bool((decoder.layers[0].qkv_w[q_rows : q_rows + attn.k_proj.weight.shape[0]] == 1).all())
        again = LeanDecoder(model, 257)
    assert again.layers[0].qkv_w.data_ptr() == decoder.layers[0].qkv_w.data_ptr()
    assert decoder.intact() and again.intact()


@pytest.mark.parametrize(
    ("model", "named"),
    [
        (lambda: _qwen2(use_sliding_window=True, sliding_window=16, max_window_layers=0), "sliding-window"),
        (lambda: _llama_softcapped(), "soft-capping"),
        (lambda: _llama_rope("dynamic"), "RoPE type 'dynamic'"),
    ],
    ids=["sliding-window", "soft-capping", "dynamic-rope"],
)
def test_models_it_does_not_model_are_refused(model, named):
    with pytest.raises(ValueError, match=f"{named}.*rollout.engine=hf"):
        LeanDecoder(model(), 257)


def test_other_families_are_refused():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        check_supported(GPT2Config())


def _llama_softcapped() -> LlamaForCausalLM:
    model = _llama()
    model.config.final_logit_softcapping = 30.0
    return model


def _llama_rope(rope_type: str) -> LlamaForCausalLM:
    model = _llama()
    params = dict(getattr(model.config, "rope_parameters", None) or {})
    params.update(rope_type=rope_type, factor=2.0)
    model.config.rope_parameters = params
    return model
