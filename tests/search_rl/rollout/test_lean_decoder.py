"""The static engine's lean forward: the HF forward's logits for Llama and Qwen2 (float32, prefill and decode, tied and
untied heads, attention and MLP biases, every RoPE scaling it accepts), fused projections that stay views of the HF
parameters, and refusals of the models it does not model (sliding windows, soft-capping, other families, other RoPE
types).

Run: python -m pytest tests/search_rl/rollout/test_lean_decoder.py -q
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from search_rl.rollout.engines.static.lean_decoder import ROPE_TYPES, LeanDecoder, check_supported
from search_rl.rollout.engines.static.slot_cache import SlotCache

VOCAB = 300
LOGIT_ULPS = 16
"""Bound on |lean - HF| in float32 ulps of the largest |logit| (``eps * max|logit|``). Both forwards compute the same
float32 function from the same weights and the same RoPE cos/sin (the lean table is the HF rotary module's output);
only the order of the additions differs (fused q/k/v and gate/up matmuls, SDPA over grouped heads packed instead of
repeated, BLAS blocking). A reordered sum rounds differently by about an ulp of its result, and RMSNorm keeps each
layer's gain near 1, so two layers leave a few ulps of the logit scale: measured <= 3.7 ulps (<= 3.6e-7 at
|logit| <= 1.35) over every comparison here. 16 ulps (<= 2.6e-6) leaves 4x margin, while a dropped RoPE scaling or
yarn attention factor moves every compared row by >= 4000 ulps (``test_the_rope_comparison_catches_a_wrong_table``)
and a wrong position, mask or head order by 1e-2 or more."""


def _assert_logits_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol = LOGIT_ULPS * torch.finfo(torch.float32).eps * float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=0, atol=atol)


def _llama(tied: bool = True, bias: bool = False, **overrides) -> LlamaForCausalLM:
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
        **overrides,
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


def _assert_prefill_and_decode_match(
    decoder: LeanDecoder, reference: PreTrainedModel, lengths: tuple[int, int, int]
) -> None:
    """Three prompts of ``lengths`` prefilled together (left-padded, into slots out of order), then two decode steps;
    every row's last logits are those of ``reference``'s plain forward over its whole sequence."""
    cache = SlotCache(reference.config, 4, max(lengths) + 4, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]
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
            _assert_logits_close(logits[r], reference(input_ids=torch.tensor([s])).logits[0, -1])
        for _ in range(2):  # decode: slots 0..3 dense (slot 1 idle, writing the scratch column)
            new = torch.randint(0, VOCAB, (3,), generator=gen).tolist()
            tok = torch.zeros(4, 1, dtype=torch.long)
            at = torch.full((4, 1), cache.scratch)
            for r, (s, slot) in enumerate(zip(seqs, slots, strict=True)):
                tok[slot, 0], at[slot, 0] = new[r], len(s)
                s.append(new[r])
            logits = decoder.forward(tok, at, cache, None, at, max(map(len, seqs)))
            for s, slot in zip(seqs, slots, strict=True):
                _assert_logits_close(logits[slot], reference(input_ids=torch.tensor([s])).logits[0, -1])


@pytest.mark.parametrize("name", list(MODELS))
def test_prefill_and_decode_give_the_hf_forwards_logits(name):
    model, reference = MODELS[name](), MODELS[name]()
    _assert_prefill_and_decode_match(LeanDecoder(model, 257), reference, (5, 11, 2))


ORIGINAL_POSITIONS = 64
"""``original_max_position_embeddings`` of the scaled configs; ``max_position_embeddings`` is 256 = 4x it (yarn's
factor, so transformers does not warn that the two disagree)."""

ROPE_SCALINGS: dict[str, dict[str, object]] = {
    # every position divided by the factor: changes every angle at every position
    "linear": {"rope_type": "linear", "factor": 4.0},
    # pairs of wavelength above original / low_freq_factor = 64 positions slowed 8x, those between 64 / 4 and 64
    # blended, faster ones kept
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": ORIGINAL_POSITIONS,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    # slow pairs interpolated 4x, fast ones kept, a ramp between (beta 32/1 rotations over 64 positions), and cos/sin
    # scaled by the attention factor 0.1 ln(4) + 1 = 1.139
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL_POSITIONS},
    # yarn's optional knobs: an explicit attention factor, other betas, the ramp bounds not rounded
    "yarn-knobs": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL_POSITIONS,
        "attention_factor": 1.5,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
}
"""Each RoPE scaling the lean forward accepts (``ROPE_TYPES`` beyond default), with transformers' parameters. Their
frequencies are fixed at construction (only ``dynamic`` and ``longrope`` read the sequence length), so what makes the
scaling visible is positions large enough for the slowed pairs to turn: ``ROPE_LENGTHS``."""

ROPE_LENGTHS = (90, 41, 3)
"""Prompt lengths of the RoPE comparisons: positions up to 91, past ``ORIGINAL_POSITIONS``. At these lengths dropping
the scaling moves every compared row's logits by >= 4000 ulps of their scale (>= 250x the ``LOGIT_ULPS`` bound), the
3-token row included."""

FAMILIES: dict[str, Callable[..., PreTrainedModel]] = {"llama": _llama, "qwen2": _qwen2}


def _scaled(family: str, scaling: str) -> PreTrainedModel:
    return FAMILIES[family](rope_parameters=dict(ROPE_SCALINGS[scaling]))


def test_every_accepted_rope_type_is_compared():
    assert {str(p["rope_type"]) for p in ROPE_SCALINGS.values()} == set(ROPE_TYPES) - {"default"}


@pytest.mark.parametrize("scaling", list(ROPE_SCALINGS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_rope_scalings_give_the_hf_forwards_logits(family, scaling):
    """Prefill past the original context and decode two steps on, against the HF model with the same scaling."""
    model, reference = _scaled(family, scaling), _scaled(family, scaling)
    assert model.model.rotary_emb.rope_type == ROPE_SCALINGS[scaling]["rope_type"]
    _assert_prefill_and_decode_match(LeanDecoder(model, 257), reference, ROPE_LENGTHS)


def _unscaled_table(decoder: LeanDecoder, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain RoPE's cos/sin (P, D): what a forward that ignored the scaling would read."""
    inv_freq = 1.0 / theta ** (torch.arange(0, decoder.head_dim, 2, dtype=torch.float32) / decoder.head_dim)
    angles = torch.arange(decoder.max_positions, dtype=torch.float32)[:, None] * inv_freq  # (P, D/2)
    emb = torch.cat((angles, angles), dim=-1)  # (P, D)
    return emb.cos(), emb.sin()


PLANTED = [(scaling, "scaling dropped") for scaling in ROPE_SCALINGS] + [
    (scaling, "attention factor dropped") for scaling, p in ROPE_SCALINGS.items() if p["rope_type"] == "yarn"
]


@pytest.mark.parametrize(("scaling", "planted"), PLANTED, ids=[f"{s}-{p.replace(' ', '-')}" for s, p in PLANTED])
def test_the_rope_comparison_catches_a_wrong_table(scaling, planted):
    """The comparison above fails for a forward that ignores the scaling, or (yarn) only its attention factor."""
    model, reference = _scaled("llama", scaling), _scaled("llama", scaling)
    decoder = LeanDecoder(model, 257)
    if planted == "scaling dropped":
        decoder.cos, decoder.sin = _unscaled_table(decoder, float(model.config.rope_parameters["rope_theta"]))
    else:
        factor = model.model.rotary_emb.attention_scaling
        assert factor != 1.0
        decoder.cos, decoder.sin = decoder.cos / factor, decoder.sin / factor
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _assert_prefill_and_decode_match(decoder, reference, ROPE_LENGTHS)


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
    ],
    ids=["sliding-window", "soft-capping"],
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


LENGTH_DEPENDENT = "its cos/sin depend on the sequence length"


@pytest.mark.parametrize(
    ("key", "rope", "why"),
    [
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, LENGTH_DEPENDENT),
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0}, LENGTH_DEPENDENT),
        (
            "rope_parameters",
            {
                "rope_type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position_embeddings": ORIGINAL_POSITIONS,
            },
            LENGTH_DEPENDENT,
        ),
        ("rope_parameters", {"rope_type": "proportional", "factor": 2.0}, "not compared with transformers' forward"),
    ],
    ids=["dynamic-legacy-rope-scaling", "dynamic", "longrope", "proportional"],
)
def test_other_rope_types_are_refused(key, rope, why):
    """Named by type, with the supported ones, whether a config.json sets ``rope_parameters`` or the legacy
    ``rope_scaling`` with ``type``."""
    cfg = LlamaConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, key: rope})
    name = rope.get("rope_type", rope.get("type"))
    named = re.escape(f"RoPE type '{name}' ({why}; supported: default, linear, llama3, yarn)")
    with pytest.raises(ValueError, match=f"{named}.*rollout.engine=hf"):
        check_supported(cfg)
