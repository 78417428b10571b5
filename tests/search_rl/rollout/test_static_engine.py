"""Static engine: the same greedy tokens and log-probs as the HF engine (multi-turn search rollout, prefix reuse,
slot refills, shared prompts), sampled log-probs of a plain forward, weight sync, device-side stops read back every
N steps, and captured decode steps (through a stand-in graph on CPU: capture, replay, the check against the eager step,
the fallback, graphs kept across calls and dropped with a grown cache; more fallbacks in test_static_fallbacks.py); on
CUDA, real graph replay = eager.

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
from search_rl.rollout.engines.static import StaticEngine
from search_rl.rollout.engines.static.engine import batch_bucket
from search_rl.rollout.generation_manager import LLMGenerationManager

PROMPTS = ["The capital of France is", "Hi", "A much longer prompt that needs left padding in a batch of three"]
GREEDY = SamplingParams(max_new_tokens=10, greedy=True)


def _ids(tokenizer, texts):
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


LOGPROB_ATOL = 1e-4
"""Two float32 forwards of the tiny model computed with other kernels (fused vs separate projections, packed vs
repeated KV heads, another padding) differ by ~1e-7 in a logit (measured 1.2e-7 to 3e-7); a log-softmax over 49k
entries adds a few float32 roundings of |logit| ~ 1. 1e-4 leaves two orders of margin and still catches a wrong
position or a stale cache column (those move log-probs by 1e-2 or more)."""


def _assert_same(a: list[Generated], b: list[Generated]) -> None:
    assert [(g.token_ids, g.finish_reason, g.stop_str) for g in a] == [
        (g.token_ids, g.finish_reason, g.stop_str) for g in b
    ]
    for ga, gb in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(ga.logprobs), torch.tensor(gb.logprobs), atol=LOGPROB_ATOL)


class RecordingGraph:
    """A stand-in for a CUDA graph: ``capture`` records the step and runs it once, ``replay`` runs it again and
    writes the result into the captured output, as a graph replay overwrites its static output. ``corrupt`` adds to
    every replayed logit (a graph that reads stale inputs)."""

    made: list[RecordingGraph] = []

    def __init__(self, corrupt: float = 0.0) -> None:
        self.corrupt, self.replays = corrupt, 0
        RecordingGraph.made.append(self)

    def capture(self, fn):
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(self.fn() + self.corrupt)


def _graphed(model, tokenizer, cfg: HFEngineConfig | None = None, corrupt: float = 0.0, **kwargs) -> StaticEngine:
    RecordingGraph.made = []
    return StaticEngine(model, tokenizer, cfg, graph_factory=lambda: RecordingGraph(corrupt), **kwargs)


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
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=48, max_obs_tokens=120, greedy=True)
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
        assert torch.allclose(a.rollout_logprobs, b.rollout_logprobs, atol=LOGPROB_ATOL)
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
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=LOGPROB_ATOL)


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


def test_a_prefill_split_over_several_forwards_gives_the_same_results(tiny_model, tokenizer, monkeypatch):
    """Admissions larger than ``PREFILL_TOKENS`` padded tokens are encoded in several forwards (rows sorted by length,
    the results put back in order): the same tokens and log-probs as the HF engine."""
    from search_rl.rollout.engines.static import engine as static

    monkeypatch.setattr(static, "PREFILL_TOKENS", 12)  # two or three rows of these prompts per forward
    prompts = _ids(tokenizer, PROMPTS) * 2 + _ids(tokenizer, ["Q: why?"])
    params = SamplingParams(max_new_tokens=8, greedy=True, stop=("e",))
    _assert_same(
        StaticEngine(tiny_model, tokenizer).generate(prompts, params),
        HFEngine(tiny_model, tokenizer).generate(prompts, params),
    )


def test_no_prompts_give_no_results(tiny_model, tokenizer):
    assert StaticEngine(tiny_model, tokenizer).generate([], GREEDY) == []


def test_a_longer_call_grows_the_cache(tiny_model, tokenizer):
    engine = StaticEngine(tiny_model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    engine.generate(prompts, GREEDY)
    assert engine._cache is not None and engine._cache.length == 128
    long = [p * 12 for p in prompts]  # > 128 tokens
    _assert_same(engine.generate(long, GREEDY), HFEngine(tiny_model, tokenizer).generate(long, GREEDY))
    assert engine._cache.length > 128


@pytest.mark.parametrize("every", [2, 8])
def test_stops_read_back_every_n_steps_give_the_same_results(tiny_model, tokenizer, every):
    """Stops found on the device (EOS, limits) and by the host at each readback (stop strings, possibly steps late:
    what followed is dropped) give what a readback after every step gives, refills included."""
    prompts = _ids(tokenizer, PROMPTS) * 3
    limits = [3, 9, 5, 1, 12, 7, 4, 20, 2]
    params = SamplingParams(max_new_tokens=20, temperature=0.8, stop=("e", "a"), seed=4)
    every_step = StaticEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=4), readback_steps=1)
    late = StaticEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=4), readback_steps=every)
    expected = every_step.generate(prompts, params, limits)
    assert {g.finish_reason for g in expected} >= {"stop", "length"}
    _assert_same(late.generate(prompts, params, limits), expected)


def test_a_sequences_samples_do_not_depend_on_its_batch(tiny_model, tokenizer):
    """Each sequence samples from its own counter-based stream: alone or beside others, the same tokens."""
    a, b, c = _ids(tokenizer, PROMPTS)
    params = SamplingParams(max_new_tokens=12, seed=7)
    engine = StaticEngine(tiny_model, tokenizer, HFEngineConfig(prefix_cache=False))
    together = engine.generate([a, b, c], params)
    assert engine.generate([a], params)[0].token_ids == together[0].token_ids
    assert engine.generate([a, b, c], SamplingParams(max_new_tokens=12, seed=8)) != together  # the seed matters


def test_captured_steps_are_checked_replayed_and_kept(tiny_model, tokenizer):
    """Each decode shape is captured once, its first two replays checked against the eager step, later ones only
    replayed; the graphs outlive calls and ``sleep``, and the output is the eager engine's."""
    prompts = _ids(tokenizer, PROMPTS) * 2
    params = SamplingParams(max_new_tokens=16, greedy=True, stop=("e",))
    engine = _graphed(tiny_model, tokenizer, HFEngineConfig(max_batch_size=4), readback_steps=4)
    eager = StaticEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=4), readback_steps=4)
    _assert_same(engine.generate(prompts, params), eager.generate(prompts, params))
    captures = engine.captures
    assert captures == len(RecordingGraph.made) >= 1
    assert sum(g.replays for g in RecordingGraph.made) > 2 * captures  # beyond the checked replays
    engine.sleep()
    _assert_same(engine.generate(prompts, params), eager.generate(prompts, params))
    assert engine.captures == captures, "the same shapes replay the graphs captured by the first call"
    assert engine.graph_fallbacks == 0 and engine.graphs.checks >= 2 * captures
    assert engine.graphs.max_difference == 0.0  # a replay runs the same kernels on the same inputs: bitwise equal


def test_a_replay_that_differs_from_the_eager_step_falls_back_to_eager(tiny_model, tokenizer, caplog):
    prompts = _ids(tokenizer, PROMPTS)
    engine = _graphed(tiny_model, tokenizer, corrupt=1e-3)
    with caplog.at_level("WARNING"):
        out = engine.generate(prompts, GREEDY)
    _assert_same(out, HFEngine(tiny_model, tokenizer).generate(prompts, GREEDY))
    assert engine.fallbacks == {"mismatch": 1} and not engine.use_graphs and len(engine.graphs) == 0
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "differs from the eager step" in warning and "(4, 128" in warning  # the shape: 4 rows, 128 columns
    replays = sum(g.replays for g in RecordingGraph.made)
    _assert_same(engine.generate(prompts, GREEDY), out)
    assert sum(g.replays for g in RecordingGraph.made) == replays, "no graph runs after the fallback"


def test_growing_the_cache_drops_its_graphs_and_their_pool(tiny_model, tokenizer):
    """A graph reads the cache it was captured with: a longer call reallocates the cache, so every graph (and their
    memory pool, which CUDA's allocator must not capture into once its graphs are freed) goes, and the new cache's
    steps are captured anew; no old graph is replayed again."""
    prompts = _ids(tokenizer, PROMPTS)
    engine = _graphed(tiny_model, tokenizer)
    engine.generate(prompts, GREEDY)
    old = list(RecordingGraph.made)
    old_replays = sum(g.replays for g in old)
    engine.graphs._pool = object()  # as if CUDA graphs shared a pool (CPU has none)
    long = [p * 12 for p in prompts]
    _assert_same(engine.generate(long, GREEDY), HFEngine(tiny_model, tokenizer).generate(long, GREEDY))
    assert sum(g.replays for g in old) == old_replays
    assert len(RecordingGraph.made) > len(old) and engine.graphs._pool is None


def test_weights_updated_in_place_keep_the_graphs(tokenizer):
    engine = _graphed(build_tiny_model(tokenizer, seed=0), tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    engine.generate(prompts, GREEDY)
    captures = engine.captures
    other = build_tiny_model(tokenizer, seed=1)
    engine.update_weights(other.named_parameters(), version=1)
    _assert_same(engine.generate(prompts, GREEDY), HFEngine(other, tokenizer).generate(prompts, GREEDY))
    assert engine.captures == captures


def test_free_on_sleep_frees_the_cache_and_graphs(tiny_model, tokenizer):
    engine = _graphed(tiny_model, tokenizer, free_on_sleep=True)
    engine.generate(_ids(tokenizer, PROMPTS), GREEDY)
    engine.sleep()
    assert engine._cache is None and len(engine.graphs) == 0


def test_parameters_moved_elsewhere_are_bound_again(tokenizer):
    """``param.data = ...`` outside the engine (a reload, a ``.to()``) breaks the fused views: the engine notices and
    fuses again instead of decoding with the old tensors."""
    model = build_tiny_model(tokenizer, seed=0)
    engine = StaticEngine(model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    engine.generate(prompts, GREEDY)
    other = build_tiny_model(tokenizer, seed=1)
    with torch.no_grad():
        for (_, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
            p.data = q.data.clone()
    _assert_same(engine.generate(prompts, GREEDY), HFEngine(other, tokenizer).generate(prompts, GREEDY))


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager_decoding(tokenizer):
    """On CUDA: the captured decode steps give the eager steps' tokens, pass their checks, and survive a weight
    update in place."""
    model = build_tiny_model(tokenizer, seed=0).cuda()
    prompts = _ids(tokenizer, PROMPTS) * 3
    graphed = StaticEngine(model, tokenizer, HFEngineConfig(max_batch_size=4))
    eager = StaticEngine(model, tokenizer, HFEngineConfig(max_batch_size=4), cuda_graphs=False)
    params = SamplingParams(max_new_tokens=16, greedy=True, stop=("e",))
    _assert_same(graphed.generate(prompts, params), eager.generate(prompts, params))
    captures = graphed.captures
    assert captures >= 1 and graphed.graph_fallbacks == 0
    other = build_tiny_model(tokenizer, seed=1)
    graphed.update_weights(other.named_parameters(), version=1)
    _assert_same(graphed.generate(prompts, params), HFEngine(other.cuda(), tokenizer).generate(prompts, params))
    assert graphed.captures == captures  # the weights were copied in place: no new capture
    long = [p * 12 for p in prompts]  # a longer call grows the cache: new graphs in a new pool
    _assert_same(graphed.generate(long, params), eager.generate(long, params))
    assert graphed.captures > captures and graphed.graph_fallbacks == 0
