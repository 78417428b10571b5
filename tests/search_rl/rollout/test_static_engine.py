"""Static engine: the same greedy tokens and log-probs as the HF engine (multi-turn search rollout, prefix reuse,
slot refills, shared prompts), sampled log-probs of a plain forward, weight sync; on CUDA, graph replay = eager.

Run: python -m pytest tests/search_rl/rollout/test_static_engine.py -q
"""

from __future__ import annotations

import pytest
import torch
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.config import HFEngineConfig, RolloutConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.models import build_tiny_model
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.static import StaticEngine, batch_bucket
from search_rl.rollout.generation_manager import LLMGenerationManager

PROMPTS = ["The capital of France is", "Hi", "A much longer prompt that needs left padding in a batch of three"]
GREEDY = SamplingParams(max_new_tokens=10, greedy=True)


def _ids(tokenizer, texts):
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _assert_same(a: list[Generated], b: list[Generated]) -> None:
    assert [(g.token_ids, g.finish_reason, g.stop_str) for g in a] == [
        (g.token_ids, g.finish_reason, g.stop_str) for g in b
    ]
    for ga, gb in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(ga.logprobs), torch.tensor(gb.logprobs), atol=1e-4)


def test_batch_buckets_are_powers_of_two_up_to_the_batch_size():
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 5, 64, 65, 300)] == [1, 2, 4, 8, 64, 64, 64]
    assert batch_bucket(40, 48) == 48


def test_engine_satisfies_protocol(tiny_model, tokenizer):
    assert isinstance(StaticEngine(tiny_model, tokenizer), RolloutEngine)


def test_refilled_slots_give_the_hf_engines_tokens(tiny_model, tokenizer):
    """Seven prompts through two slots, with per-sample limits and stops: every slot is refilled several times."""
    prompts = _ids(tokenizer, PROMPTS) * 2 + _ids(tokenizer, ["Q: why?"])
    limits = [3, 9, 5, 1, 12, 7, 4]
    params = SamplingParams(max_new_tokens=12, greedy=True, stop=("e", "a"))
    static = StaticEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=2))
    _assert_same(
        static.generate(prompts, params, limits), HFEngine(tiny_model, tokenizer).generate(prompts, params, limits)
    )


def test_multi_turn_with_prefix_reuse_matches_the_hf_engine(tiny_model, tokenizer):
    """Turn 2 = turn 1's sequence + inserted tokens: the static engine reuses the prefix, as the HF engine does."""
    static, hf = StaticEngine(tiny_model, tokenizer), HFEngine(tiny_model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    first = static.generate(prompts, GREEDY)
    _assert_same(first, hf.generate(prompts, GREEDY))
    inserted = tokenizer.encode("\n\n<information>Doc 1(Title: X) inserted text</information>\n\n")
    second = [p + list(g.token_ids) + inserted for p, g in zip(prompts, first, strict=True)]
    _assert_same(static.generate(second, GREEDY), hf.generate(second, GREEDY))
    assert static.prefix.stats.hits == 3
    assert static.prefix.stats.reused_tokens == hf.prefix.stats.reused_tokens == sum(len(p) + 9 for p in prompts)


def test_search_rollout_matches_the_hf_engine(tiny_model, tokenizer, make_scripted_engine, make_prompt):
    """A whole multi-turn search rollout, greedy: the same trajectories (ids, masks) and log-probs within 1e-4.

    A mild scripted bias (8, not the fixture's 100) steers the random model through two searches and an answer,
    so the log-probs still depend on the model's own logits."""
    p_a, p_b, p_c = (make_prompt(q) for q in ("When was Deadpool 2 released?", "Who won?", "Where is Paris?"))
    scripts = {
        tuple(p_a): [
            "<search> Deadpool 2 release </search>",
            "<search> Nobel Prize </search>",
            "<answer> 2018 </answer>",
        ],
        tuple(p_b): ["<answer> nobody </answer>"],
        tuple(p_c): ["<search> Paris </search>", "<answer> France </answer>"],
    }
    retriever = InMemoryRetriever(shipped_passages(), topk=2)
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=48, max_obs_tokens=120, greedy=True)
    results = []
    for make in (
        HFEngine,
        lambda m, t, logits_processor: StaticEngine(m, t, HFEngineConfig(max_batch_size=2), logits_processor),
    ):
        nudge = make_scripted_engine(scripts).inner.logits_processor  # a fresh ScriptedLogits per engine
        nudge.BIAS = 8.0
        manager = LLMGenerationManager(make(tiny_model, tokenizer, logits_processor=nudge), tokenizer, retriever, cfg)
        results.append(manager.generate([p_a, p_b, p_c], seed=0).trajectories)
    for a, b in zip(*results, strict=True):
        assert a.response_ids.tolist() == b.response_ids.tolist()
        assert a.response_mask.tolist() == b.response_mask.tolist()
        assert a.stop_reason == b.stop_reason
        assert torch.allclose(a.rollout_logprobs, b.rollout_logprobs, atol=1e-4)
        assert a.rollout_logprobs[a.response_mask == 1].max() < -1e-3  # not pinned to 0 by the bias
    assert sum(t.num_searches for t in results[1]) == 3


def test_repeated_prompts_are_encoded_once(tiny_model, tokenizer):
    a, b = _ids(tokenizer, PROMPTS[:2])
    engine = StaticEngine(tiny_model, tokenizer)
    out = engine.generate([a, a, a, b, b], SamplingParams(max_new_tokens=8, seed=11))
    assert engine.shared_prompt_tokens == 2 * len(a) + len(b)
    assert len({g.token_ids for g in out[:3]}) > 1  # copies diverge: each slot samples on its own
    distinct = HFEngine(tiny_model, tokenizer).generate([a, b], GREEDY)
    shared = engine.generate([a, a, a, b, b], GREEDY)
    _assert_same(shared, [distinct[0]] * 3 + [distinct[1]] * 2)


def test_sampled_logprobs_match_temperature_scaled_forward(tiny_model, tokenizer):
    engine = StaticEngine(tiny_model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.5, top_p=0.9, seed=0))
    assert [g.token_ids for g in out] == [
        g.token_ids
        for g in engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.5, top_p=0.9, seed=0))
    ]
    for prompt, g in zip(prompts, out, strict=True):
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([prompt + list(g.token_ids)])).logits[0, len(prompt) - 1 : -1]
        ref = torch.log_softmax(logits / 0.5, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)


def test_update_weights_gives_the_new_models_outputs(tokenizer):
    engine = StaticEngine(build_tiny_model(tokenizer, seed=0), tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    before = engine.generate(prompts, GREEDY)
    other = build_tiny_model(tokenizer, seed=1)
    engine.update_weights(other.named_parameters(), version=3)
    assert engine.weight_version == 3
    after = engine.generate([p + list(g.token_ids) for p, g in zip(prompts, before, strict=True)], GREEDY)
    assert engine.prefix.stats.hits == 0  # states of the old weights are not reused
    reference = HFEngine(other, tokenizer).generate(
        [p + list(g.token_ids) for p, g in zip(prompts, before, strict=True)], GREEDY
    )
    _assert_same(after, reference)
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], version=4)


def test_a_longer_call_grows_the_cache_and_sleep_frees_it(tiny_model, tokenizer):
    engine = StaticEngine(tiny_model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    engine.generate(prompts, GREEDY)
    assert engine._cache is not None and engine._cache.length == 128
    long = [p * 12 for p in prompts]  # > 128 tokens
    _assert_same(engine.generate(long, GREEDY), HFEngine(tiny_model, tokenizer).generate(long, GREEDY))
    assert engine._cache.length > 128
    engine.sleep()
    assert engine._pool is None
    assert engine._cache is None
    _assert_same(engine.generate(prompts, GREEDY), HFEngine(tiny_model, tokenizer).generate(prompts, GREEDY))


def test_growing_the_cache_drops_the_graph_pool_with_its_graphs(tiny_model, tokenizer):
    """A CUDA graph pool whose graphs were all freed must not be captured into again (CUDA's caching allocator
    asserts ``use_count > 0``; it did on an H200 when a longer call grew the cache), so it goes with them."""
    engine = StaticEngine(tiny_model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    engine.generate(prompts, GREEDY)
    engine._pool = object()  # as if graphs had been captured into a pool (CPU never captures)
    engine.generate(prompts, GREEDY)
    assert engine._pool is not None  # same cache: its graphs and their pool stay
    engine.generate([p * 12 for p in prompts], GREEDY)
    assert engine._pool is None


def test_rejects_attention_without_explicit_masks(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="rollout.engine=hf"):
        StaticEngine(model, tokenizer)


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager_decoding(tokenizer):
    """On CUDA: the captured decode step gives the eager step's tokens, and survives a weight update in place."""
    model = build_tiny_model(tokenizer, seed=0).cuda()
    prompts = _ids(tokenizer, PROMPTS) * 3
    graphed = StaticEngine(model, tokenizer, HFEngineConfig(max_batch_size=4))
    eager = StaticEngine(model, tokenizer, HFEngineConfig(max_batch_size=4), cuda_graphs=False)
    params = SamplingParams(max_new_tokens=16, greedy=True, stop=("e",))
    _assert_same(graphed.generate(prompts, params), eager.generate(prompts, params))
    assert graphed.captures == 1
    other = build_tiny_model(tokenizer, seed=1)
    graphed.update_weights(other.named_parameters(), version=1)
    _assert_same(graphed.generate(prompts, params), HFEngine(other.cuda(), tokenizer).generate(prompts, params))
    assert graphed.captures == 1  # the weights were copied in place: no new capture
    long = [p * 12 for p in prompts]  # a longer call grows the cache: new graphs in a new pool
    _assert_same(graphed.generate(long, params), eager.generate(long, params))
    assert graphed.captures == 2
