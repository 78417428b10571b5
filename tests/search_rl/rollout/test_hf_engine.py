"""HF engine: KV-cached left-padded decoding equals a plain forward pass, stops, greedy, seeds, logprobs, weights.

Run: python -m pytest tests/search_rl/rollout/test_hf_engine.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close, logit_terms, logprob_scale, predicting_inputs, reorder_tol

from search_rl.config import HFEngineConfig
from search_rl.datatypes import SamplingParams
from search_rl.models import build_tiny_model
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.prefix_cache import balance_reuse, common_prefix_length

PROMPTS = ["The capital of France is", "Hi", "A much longer prompt that needs left padding in a batch of three"]


def _ids(tokenizer, texts):
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _full_forward_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits (L, V) of an unpadded, uncached forward pass: the reference the engine must agree with."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def _assert_same_logprobs(model, generated, expected: torch.Tensor, prompt: list[int], temperature=1.0) -> None:
    """An engine's log-probs of ``generated`` equal ``expected`` (a plain forward's, or another engine's) up to the
    order its padded, KV-cached batches sum in: attention over at most the sequence's tokens, at the scale of the
    logits behind them (``numerics.logprob_scale``; ``model`` the engine's)."""
    got = torch.tensor(generated.logprobs)
    hidden, head = predicting_inputs(model, prompt + list(generated.token_ids), len(prompt))
    scale = logprob_scale(hidden, head, temperature)
    assert_reordered_close(got, expected.to(got.dtype), len(prompt) + len(got), scale=scale)


def _argmax_up_to_rounding(model, chosen: torch.Tensor, logits: torch.Tensor, ids: list[int], start: int) -> bool:
    """Whether each chosen logit is its row's maximum up to the rounding of the sums behind the logits of ``ids``'
    tokens from ``start`` (``model``'s), attention over at most the sequence: a logit ``hidden . head_j`` is off by
    ``reorder_tol`` of its terms' ``sum |.|`` (``numerics.logit_terms``), the chosen one and the largest each, so the
    engine may break a tie that close either way."""
    noise = 2 * reorder_tol(len(ids)) * logit_terms(*predicting_inputs(model, ids, start))
    return bool(torch.all(chosen >= logits.max(-1).values - noise))


def test_engine_satisfies_protocol(tiny_engine):
    assert isinstance(tiny_engine, RolloutEngine)
    assert tiny_engine.eos_token_ids == (2,)


def test_greedy_batched_equals_unpadded_argmax(tiny_engine, tiny_model, tokenizer):
    """Greedy with left padding + KV cache picks, at every step, the argmax of a plain forward over the sequence."""
    prompts = _ids(tokenizer, PROMPTS)
    out = tiny_engine.generate(prompts, SamplingParams(max_new_tokens=12, greedy=True))
    assert [len(g.token_ids) for g in out] == [12, 12, 12]
    for prompt, g in zip(prompts, out, strict=True):
        logits = _full_forward_logits(tiny_model, prompt + list(g.token_ids))
        steps = logits[len(prompt) - 1 : -1]  # (12, V) logits that chose each generated token
        chosen = steps.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert _argmax_up_to_rounding(tiny_model, chosen, steps, prompt + list(g.token_ids), len(prompt))
        ref_lp = torch.log_softmax(steps, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        _assert_same_logprobs(tiny_model, g, ref_lp, prompt)


def test_greedy_ignores_seed_and_batch_size(tiny_model, tokenizer):
    prompts = _ids(tokenizer, PROMPTS)
    a = HFEngine(tiny_model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=8, greedy=True, seed=1))
    b = HFEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=1)).generate(
        prompts, SamplingParams(max_new_tokens=8, greedy=True, seed=2)
    )
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_seed_reproducible_and_different_seeds_differ(tiny_engine, tokenizer):
    prompts = _ids(tokenizer, PROMPTS)
    p1 = SamplingParams(max_new_tokens=10, seed=7)
    a = tiny_engine.generate(prompts, p1)
    b = tiny_engine.generate(prompts, p1)
    c = tiny_engine.generate(prompts, SamplingParams(max_new_tokens=10, seed=8))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_sampled_logprobs_match_temperature_scaled_forward(tiny_engine, tiny_model, tokenizer):
    prompt = _ids(tokenizer, PROMPTS[:1])[0]
    g = tiny_engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.5, seed=0))[0]
    logits = _full_forward_logits(tiny_model, prompt + list(g.token_ids))[len(prompt) - 1 : -1] / 0.5
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    _assert_same_logprobs(tiny_model, g, ref, prompt, temperature=0.5)


def test_top_k_one_is_greedy(tiny_engine, tokenizer):
    prompts = _ids(tokenizer, PROMPTS)
    greedy = tiny_engine.generate(prompts, SamplingParams(max_new_tokens=6, greedy=True))
    top1 = tiny_engine.generate(prompts, SamplingParams(max_new_tokens=6, top_k=1, seed=3))
    assert [g.token_ids for g in greedy] == [g.token_ids for g in top1]


def test_per_sample_stop_keeps_nothing_after_the_stop(tiny_model, tokenizer, make_scripted_engine):
    """Each sample stops right after its own stop string; the rest of its script is never generated."""
    prompts = _ids(tokenizer, ["one", "two", "three"])
    scripts = {
        tuple(prompts[0]): ["<think>x</think><search> capital of France </search> TRAILING words here"],
        tuple(prompts[1]): ["<answer> Paris </answer> MORE after the answer"],
        tuple(prompts[2]): ["no stop string in this text at all, it just keeps going on and on " * 3],
    }
    engine = make_scripted_engine(scripts)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=24, stop=("</search>", "</answer>")))
    texts = [tokenizer.decode(g.token_ids) for g in out]
    assert texts[0] == "<think>x</think><search> capital of France </search>"
    assert (out[0].finish_reason, out[0].stop_str) == ("stop", "</search>")
    assert texts[1] == "<answer> Paris </answer>"
    assert (out[1].finish_reason, out[1].stop_str) == ("stop", "</answer>")
    assert out[2].finish_reason == "length" and len(out[2].token_ids) == 24
    assert "TRAILING" not in texts[0] and "MORE" not in texts[1]


def test_eos_ends_a_sample_and_is_kept(tokenizer, make_scripted_engine):
    prompts = _ids(tokenizer, ["a", "b"])
    engine = make_scripted_engine({tuple(prompts[0]): ["short"], tuple(prompts[1]): ["a longer scripted text"]})
    out = engine.generate(prompts, SamplingParams(max_new_tokens=30, stop=("</search>",)))
    assert out[0].finish_reason == "eos" and out[0].token_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(out[0].token_ids[:-1]) == "short"
    assert out[1].finish_reason == "eos" and tokenizer.decode(out[1].token_ids[:-1]) == "a longer scripted text"


def test_per_sample_max_new_tokens(tiny_engine, tokenizer):
    prompts = _ids(tokenizer, PROMPTS)
    out = tiny_engine.generate(prompts, SamplingParams(max_new_tokens=50, greedy=True), max_new_tokens=[3, 1, 5])
    assert [len(g.token_ids) for g in out] == [3, 1, 5]
    assert all(g.finish_reason == "length" for g in out)


def test_generate_rejects_bad_calls(tiny_engine, tokenizer):
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        tiny_engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="exceeds|> context"):
        tiny_engine.generate([[1] * 4090], SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="2 max_new_tokens for 1 prompts"):
        tiny_engine.generate([[1, 2]], SamplingParams(), max_new_tokens=[1, 2])
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)


def test_update_weights_changes_outputs_and_version(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    engine = HFEngine(model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS)
    before = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    other = build_tiny_model(tokenizer, seed=1)
    engine.update_weights(other.named_parameters(), version=3)
    after = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    reference = HFEngine(other, tokenizer).generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    assert engine.weight_version == 3
    assert [g.token_ids for g in after] == [g.token_ids for g in reference] != [g.token_ids for g in before]
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], version=4)
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))], version=4)


def test_prefix_cache_reuses_the_previous_turn_exactly(tiny_model, tokenizer):
    """Turn 2 = turn 1's sequence + inserted tokens: only the new tokens are encoded, and results are unchanged."""
    prompts = _ids(tokenizer, PROMPTS)
    cached = HFEngine(tiny_model, tokenizer)
    fresh = HFEngine(tiny_model, tokenizer, HFEngineConfig(prefix_cache=False))
    params = SamplingParams(max_new_tokens=6, greedy=True)
    first = cached.generate(prompts, params)
    inserted = tokenizer.encode("\n\n<information>Doc 1(Title: X) inserted text</information>\n\n")
    second = [p + list(g.token_ids) + inserted for p, g in zip(prompts, first, strict=True)]
    second[1] = second[1][:-3]  # a prompt that stops inside the inserted text still reuses the shared prefix
    a = cached.generate(second, params)
    b = fresh.generate(second, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for prompt, ga, gb in zip(second, a, b, strict=True):
        _assert_same_logprobs(tiny_model, ga, torch.tensor(gb.logprobs), prompt)
    # each sample reused its whole previous sequence except the last sampled token (never fed to the model), but
    # the shortened prompt re-encodes 3 of its reused tokens: every row encodes as many as the longest suffix
    assert cached.prefix.stats.hits == 3
    assert cached.prefix.stats.reused_tokens == sum(len(p) + 6 - 1 for p in prompts) - 3
    assert fresh.prefix.stats.hits == 0
    for prompt, g in zip(second, a, strict=True):  # and they agree with a plain forward pass
        logits = _full_forward_logits(tiny_model, prompt + list(g.token_ids))[len(prompt) - 1 : -1]
        chosen = logits.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert _argmax_up_to_rounding(tiny_model, chosen, logits, prompt + list(g.token_ids), len(prompt))


def test_a_prompt_without_stored_prefix_makes_the_batch_span_its_longest_prompt(tiny_model, tokenizer):
    """Reuse beside a prompt with none is trimmed: the forward spans max(prompt length) columns (not reused + new
    ones), the rows still reuse what costs nothing extra, and the tokens equal those of an engine without reuse."""
    prompts = _ids(tokenizer, PROMPTS)
    params = SamplingParams(max_new_tokens=5, greedy=True)
    cached = HFEngine(tiny_model, tokenizer)
    first = cached.generate(prompts[:1], params)
    long_turn = prompts[0] + list(first[0].token_ids) + prompts[2]  # could reuse len(prompts[0]) + 4 tokens
    other = prompts[2] + prompts[2][:7]  # no stored prefix: encodes all its tokens, more than long_turn's new ones
    batch = [long_turn, other]
    widths: list[int] = []
    forward = cached.forward
    cached.forward = lambda ids, att, pos, cache: widths.append(att.shape[1]) or forward(ids, att, pos, cache)
    out = cached.generate(batch, params)
    assert widths[0] == max(len(p) for p in batch)
    assert 0 < len(long_turn) - len(other) < len(prompts[0]) + 4
    assert cached.prefix.stats.reused_tokens == len(long_turn) - len(other)
    fresh = HFEngine(tiny_model, tokenizer, HFEngineConfig(prefix_cache=False)).generate(batch, params)
    assert [g.token_ids for g in out] == [g.token_ids for g in fresh]


def test_a_common_prompt_prefix_is_encoded_once(tiny_model, tokenizer):
    """Prompts that start with the same instruction template share its states: it is encoded once for the call,
    and each row's tokens and log-probs are those of its own unpadded forward pass."""
    template = _ids(tokenizer, ["Answer the question. Think first, search when you need to, and answer briefly. " * 3])
    questions = _ids(tokenizer, PROMPTS)
    prompts = [template[0] + q for q in questions]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    engine = HFEngine(tiny_model, tokenizer)
    forwards: list[tuple[int, int]] = []
    forward = engine.forward
    engine.forward = lambda ids, att, pos, cache: forwards.append(tuple(ids.shape)) or forward(ids, att, pos, cache)
    out = engine.generate(prompts, params)
    n = common_prefix_length(prompts)
    assert n >= len(template[0]) - 1
    assert forwards[0] == (1, n)  # the template alone, once
    assert forwards[1] == (3, max(len(p) for p in prompts) - n)  # then only what follows it
    # a shorter prompt re-encodes the template's end so that every row encodes as many tokens as the longest
    assert engine.prefix.stats.common_tokens == sum(len(p) for p in prompts) - 3 * forwards[1][1]
    fresh = HFEngine(tiny_model, tokenizer, HFEngineConfig(prefix_cache=False)).generate(prompts, params)
    assert [g.token_ids for g in out] == [g.token_ids for g in fresh]
    for prompt, g in zip(prompts, out, strict=True):
        logits = _full_forward_logits(tiny_model, prompt + list(g.token_ids))[len(prompt) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        _assert_same_logprobs(tiny_model, g, ref, prompt)


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 2], [1, 2]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3


def test_balance_reuse_trims_to_the_longest_suffix():
    kv = [(torch.arange(10.0).reshape(1, 10, 1), -torch.arange(10.0).reshape(1, 10, 1))]
    found = [(8, kv), (0, None), (3, [(k[:, :3], v[:, :3]) for k, v in kv])]
    out = balance_reuse([10, 6, 12], found)  # new tokens 2, 6, 9 -> every row encodes 9 (the 6-token one: 6)
    assert [c for c, _ in out] == [1, 0, 3]
    assert out[1][1] is None and out[0][1][0][0].shape == (1, 1, 1)
    assert [c for c, _ in balance_reuse([10, 20], [(8, kv), (0, None)])] == [0, 0]
    out = balance_reuse([10, 12], [(8, kv), (9, kv)])  # new tokens 2, 3 -> row 0 keeps 7
    assert [c for c, _ in out] == [7, 9]
    assert torch.equal(out[0][1][0][0][0, :, 0], torch.arange(7.0))
    assert out[1][1] is kv


def test_prefix_cache_is_dropped_when_weights_change(tokenizer):
    engine = HFEngine(build_tiny_model(tokenizer, seed=0), tokenizer)
    prompts = _ids(tokenizer, PROMPTS[:1])
    g = engine.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))[0]
    engine.update_weights(build_tiny_model(tokenizer, seed=5).named_parameters(), version=1)
    engine.generate([prompts[0] + list(g.token_ids) + [28]], SamplingParams(max_new_tokens=2, greedy=True))
    assert engine.prefix.stats.hits == 0


def test_repeated_prompts_are_encoded_once_and_sampled_independently(tiny_model, tokenizer):
    """A GRPO group's n copies of a prompt share one prefill; every copy still samples its own continuation, whose
    log-probs are those of a plain forward pass over its own sequence."""
    a, b = _ids(tokenizer, PROMPTS[:2])
    prompts = [a, a, a, b, b]
    engine = HFEngine(tiny_model, tokenizer)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=11))
    assert engine.shared_prompt_tokens == 2 * len(a) + len(b)
    assert len({g.token_ids for g in out[:3]}) > 1  # copies diverge: each row samples on its own
    for prompt, g in zip(prompts, out, strict=True):
        logits = _full_forward_logits(tiny_model, prompt + list(g.token_ids))[len(prompt) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        _assert_same_logprobs(tiny_model, g, ref, prompt)
    distinct = HFEngine(tiny_model, tokenizer).generate([a, b], SamplingParams(max_new_tokens=8, greedy=True))
    shared = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    assert [g.token_ids for g in shared] == [distinct[0].token_ids] * 3 + [distinct[1].token_ids] * 2


def test_reordering_rows_when_samples_finish_changes_no_sample(tiny_model, tokenizer, monkeypatch):
    """Finished rows are replaced by rows from the end of the batch (``fill_holes``); each sample still gets the
    random draws it would get with the rows kept in order, so seeded output is the same either way."""
    import search_rl.rollout.engines.hf.engine as hf_module

    prompts = _ids(tokenizer, [*PROMPTS, "Who wrote Hamlet", "One", "Two words", "The sea is"])
    limits = [3, 11, 5, 14, 2, 9, 6]  # rows leave at different steps, early rows first: holes to fill
    params = SamplingParams(max_new_tokens=14, temperature=1.0, seed=5, logprobs=True)
    moved = HFEngine(tiny_model, tokenizer).generate(prompts, params, limits)
    monkeypatch.setattr(hf_module, "fill_holes", lambda keep, rows: keep)  # rows kept in order, as before
    in_order = HFEngine(tiny_model, tokenizer).generate(prompts, params, limits)
    assert [len(g.token_ids) for g in moved] == limits
    assert [g.token_ids for g in moved] == [g.token_ids for g in in_order]
    for prompt, a, b in zip(prompts, moved, in_order, strict=True):
        _assert_same_logprobs(tiny_model, a, torch.tensor(b.logprobs), prompt)
