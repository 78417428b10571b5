"""The ``RolloutEngine`` contract, checked on every backend: HF and static always; vLLM when installed (skipped
otherwise).

The checks are model-agnostic (a random model, frequent one-character stop strings), so the same assertions hold
for any engine: one result per prompt in order, nothing after a stop, limits honoured, greedy deterministic.

Run: python -m pytest tests/search_rl/rollout/test_engine_contract.py -q   (vLLM cases: .venv-vllm/bin/python, make
install-vllm)
"""

from __future__ import annotations

import math

import pytest
from numerics import FP32_EPS

from search_rl.datatypes import SamplingParams
from search_rl.models import build_tiny_model
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.static import StaticEngine

STOPS = ("e", "a")  # frequent characters: a random model hits them within a few tokens


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    """A tiny random model saved as a local HF directory (what vLLM loads); 256 wide so that head_dim is 64,
    since vLLM's CPU attention rejects the default tiny model's head_dim of 16."""
    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(tokenizer, seed=0, hidden_size=256).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def vllm_engine(tiny_dir):
    """One vLLM engine for the module's cases (they do not change its weights): a start costs tens of seconds."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm, or search-rl[vllm] on GPU)")
    from search_rl.config import VLLMEngineConfig
    from search_rl.rollout.engines.vllm import VLLMEngine

    return VLLMEngine(str(tiny_dir), settings=VLLMEngineConfig(kv_cache_gib=0.25))


@pytest.fixture(params=["hf", "static", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request, tiny_model, tokenizer) -> RolloutEngine:
    if request.param == "hf":
        return HFEngine(tiny_model, tokenizer)
    if request.param == "static":
        return StaticEngine(tiny_model, tokenizer)
    return request.getfixturevalue("vllm_engine")


def _prompts(tokenizer):
    texts = ["Once upon a time", "Q:", "The quick brown fox jumps over the lazy dog and then"]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _first_stop_end(tokenizer, ids, stops) -> int | None:
    """Smallest k such that the first k tokens contain a stop string (None if none do)."""
    for k in range(1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:k]) for s in stops):
            return k
    return None


def test_results_in_order_and_nothing_after_stop(engine, tokenizer):
    prompts = _prompts(tokenizer)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=20, stop=STOPS, seed=0))
    assert len(out) == len(prompts)
    for g in out:
        ids = list(g.token_ids)
        end = _first_stop_end(tokenizer, ids, STOPS)
        if g.finish_reason == "stop":
            assert end == len(ids), "the stop string must complete in the last token, with nothing after it"
            assert g.stop_str in tokenizer.decode(ids)
        elif g.finish_reason == "length":
            assert end is None and len(ids) == 20
        else:
            assert ids[-1] in engine.eos_token_ids and end is None
        assert g.logprobs is not None and len(g.logprobs) == len(ids)
        # log p <= 0, computed as logit - logsumexp: at p ~ 1 the log of a sum in [1, V] is off by up to eps log V
        assert all(lp <= 2 * FP32_EPS * math.log(len(tokenizer)) for lp in g.logprobs)


def test_greedy_is_deterministic(engine, tokenizer):
    prompts = _prompts(tokenizer)
    a = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True, seed=1))
    b = engine.generate(prompts[::-1], SamplingParams(max_new_tokens=8, greedy=True, seed=2))
    assert [g.token_ids for g in a] == [g.token_ids for g in b[::-1]]


def test_limits_per_sample(engine, tokenizer):
    out = engine.generate(_prompts(tokenizer), SamplingParams(max_new_tokens=9, greedy=True), max_new_tokens=[1, 2, 3])
    assert all(len(g.token_ids) == n or g.finish_reason == "eos" for g, n in zip(out, [1, 2, 3], strict=True))


def test_same_seed_same_samples(engine, tokenizer):
    p = SamplingParams(max_new_tokens=8, seed=11)
    assert [g.token_ids for g in engine.generate(_prompts(tokenizer), p)] == [
        g.token_ids for g in engine.generate(_prompts(tokenizer), p)
    ]
