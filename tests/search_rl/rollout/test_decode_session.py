"""Continuous batching: the HF engine's ``DecodeSession`` and the agent loop's ``rollout.schedule=continuous``.

A session must give each sequence what ``generate`` gives it, whoever shares its steps; the agent loop must give the
same trajectories as lock-step turns, and keep decoding while a search is in flight.

Run: python -m pytest tests/search_rl/rollout/test_decode_session.py -q
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from numerics import assert_reordered_close, logprob_scale, predicting_inputs

from search_rl.config import HFEngineConfig, RolloutConfig
from search_rl.datatypes import Generated, Passage, SamplingParams
from search_rl.rollout.engines.base import DecodeSession, SessionEngine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.tags import STOP_STRINGS

TEXTS = ["The capital of France is", "Hi", "A much longer prompt that needs left padding in a batch", "Who wrote it"]


def _ids(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _drain(session: DecodeSession, late: dict[int, tuple[int, list[int], int, int | None]] | None = None):
    """Step until every sequence is back; ``late``: {step number: (key, prompt, limit, seed)} submitted then.
    Returns ({key: Generated}, steps taken)."""
    out: dict[int, Generated] = {}
    steps = 0
    late = dict(late or {})
    while session.pending or late:
        if steps in late:
            session.submit(*late.pop(steps))
        for key, g in session.step():
            assert key not in out, "a sequence came back twice"
            out[key] = g
        steps += 1
    return out, steps


def test_hf_engine_is_a_session_engine(tiny_engine):
    assert isinstance(tiny_engine, SessionEngine)
    assert tiny_engine.supports_sessions
    assert isinstance(tiny_engine.open_session(SamplingParams(greedy=True)), DecodeSession)


def test_greedy_session_with_late_joiners_equals_generate(tiny_engine, tokenizer):
    """Sequences joining at different steps (padding and caches merged, leading columns trimmed) get exactly the
    tokens and log-probs that ``generate`` gives each of them alone."""
    prompts = _ids(tokenizer, TEXTS)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    session = tiny_engine.open_session(params)
    session.submit(0, prompts[0], 10, None)
    session.submit(1, prompts[1], 4, None)
    out, _ = _drain(session, {2: (2, prompts[2], 10, None), 6: (3, prompts[3], 7, None)})
    for key, limit in [(0, 10), (1, 4), (2, 10), (3, 7)]:
        alone = HFEngine(tiny_engine.model, tokenizer).generate([prompts[key]], params, [limit])[0]
        assert out[key].token_ids == alone.token_ids
        assert out[key].finish_reason == alone.finish_reason == "length"
        # merged caches and trimmed columns attend over the sequence in another order, at the scale of the logits
        # behind the log-probs (tests/numerics.py)
        n_terms = len(prompts[key]) + limit
        scale = logprob_scale(
            *predicting_inputs(tiny_engine.model, prompts[key] + list(alone.token_ids), len(prompts[key]))
        )
        assert_reordered_close(torch.tensor(out[key].logprobs), torch.tensor(alone.logprobs), n_terms, scale=scale)


def test_seeded_samples_do_not_depend_on_batch_mates(tiny_model, tokenizer):
    prompts = _ids(tokenizer, TEXTS)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    alone, _ = _drain(_open(tiny_model, tokenizer, params, [(0, prompts[0], 12, 7)]))
    crowd = _open(tiny_model, tokenizer, params, [(k, p, 12, 100 + k) for k, p in enumerate(prompts) if k])
    shared, _ = _drain(crowd, {3: (0, prompts[0], 12, 7)})
    other, _ = _drain(_open(tiny_model, tokenizer, params, [(0, prompts[0], 12, 8)]))
    assert shared[0].token_ids == alone[0].token_ids
    assert other[0].token_ids != alone[0].token_ids  # the seed does choose the samples


def _open(model, tokenizer, params, submits, cfg: HFEngineConfig | None = None):
    session = HFEngine(model, tokenizer, cfg).open_session(params)
    for submit in submits:
        session.submit(*submit)
    return session


def test_resubmitted_key_reuses_its_states(tiny_engine, tokenizer):
    """A sequence submitted again with its prompt extended (the next turn) encodes only the new tokens and decodes
    what a fresh engine decodes from the whole prompt."""
    prompt, more = _ids(tokenizer, ["The capital of France is", " an observation"])
    params = SamplingParams(max_new_tokens=6, greedy=True)
    session = tiny_engine.open_session(params)
    session.submit(0, prompt, 6, None)
    first, _ = _drain(session)
    before = tiny_engine.prefix.stats.reused_tokens
    extended = prompt + list(first[0].token_ids) + more
    session.submit(0, extended, 6, None)
    second, _ = _drain(session)
    assert tiny_engine.prefix.stats.reused_tokens - before == len(prompt) + len(first[0].token_ids) - 1
    fresh = HFEngine(tiny_engine.model, tokenizer, HFEngineConfig(prefix_cache=False))
    assert second[0].token_ids == fresh.generate([extended], params)[0].token_ids


def test_session_stops_at_stop_strings_and_checks_limits(make_scripted_hf, tokenizer, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_hf({tuple(p): ["<search>x</search> never reached"]})
    session = engine.open_session(SamplingParams(max_new_tokens=64, stop=STOP_STRINGS, seed=0))
    session.submit(0, p, 64, 0)
    out, _ = _drain(session)
    assert out[0].finish_reason == "stop" and out[0].stop_str == "</search>"
    assert tokenizer.decode(out[0].token_ids).endswith("</search>")
    with pytest.raises(ValueError, match="max_new_tokens"):
        session.submit(1, p, 0, None)
    with pytest.raises(ValueError, match="context"):
        session.submit(1, p, engine.max_model_len, None)


def test_batch_size_bounds_running_sequences(tiny_model, tokenizer):
    prompts = _ids(tokenizer, TEXTS)
    params = SamplingParams(max_new_tokens=5, greedy=True)
    session = _open(
        tiny_model,
        tokenizer,
        params,
        [(k, p, 5, None) for k, p in enumerate(prompts)],
        HFEngineConfig(max_batch_size=2),
    )
    out, steps = _drain(session)
    assert sorted(out) == [0, 1, 2, 3]
    assert steps == 9  # two waves of five tokens; the second is admitted in the step the first finishes


class SlowRetriever:
    """Answers after ``delay_s``, recording how many decode steps ran while each search was in flight."""

    def __init__(self, delay_s: float, steps: list[int]) -> None:
        self.delay_s, self.steps, self.overlap = delay_s, steps, []

    async def search(self, queries, topk=None):
        before = len(self.steps)
        await asyncio.sleep(self.delay_s)
        self.overlap.append(len(self.steps) - before)
        return [[Passage(f"d{i}", q, f"about {q}", 1.0)] for i, q in enumerate(queries)]


def _scripts(make_prompt):
    fast, slow = make_prompt("fast"), make_prompt("slow")
    scripts = {
        tuple(fast): ["<search>paris</search>", "<answer>Paris</answer>"],
        tuple(slow): ["I think about it for a long while, without any hurry at all, " * 3 + "<answer>no</answer>"],
    }
    return [fast, slow], scripts


def _counting(session, steps: list[int]):
    step = session.step

    def counted():
        steps.append(threading.get_ident())
        time.sleep(0.02)  # a decode step that takes real time, so the search's wait overlaps some
        return step()

    session.step = counted
    return session


def test_continuous_schedule_decodes_while_searching_and_matches_turns(make_scripted_hf, tokenizer, make_prompt):
    prompts, scripts = _scripts(make_prompt)
    cfg = dict(search_turns=2, max_turn_tokens=128, max_obs_tokens=64, max_response_tokens=512)
    results = {}
    for schedule in ("turns", "continuous"):
        steps: list[int] = []
        engine = make_scripted_hf(scripts)
        opened = engine.open_session
        engine.open_session = lambda params, opened=opened, steps=steps: _counting(opened(params), steps)  # type: ignore[method-assign]
        retriever = SlowRetriever(0.5, steps)
        manager = LLMGenerationManager(engine, tokenizer, retriever, RolloutConfig(**cfg, schedule=schedule, seed=3))
        result = manager.generate(prompts)
        results[schedule] = (result, retriever.overlap, steps)
    turns, continuous = results["turns"][0], results["continuous"][0]
    for a, b in zip(turns.trajectories, continuous.trajectories, strict=True):
        assert a.final_answer == b.final_answer
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert [t.final_answer for t in continuous.trajectories] == ["Paris", "no"]
    assert results["turns"][2] == []  # lock-step turns never open a session
    assert results["continuous"][1][0] > 0, "the slow sample decoded while the fast one's search was in flight"
    assert threading.main_thread().ident not in results["continuous"][2]  # steps ran off the event loop's thread
    assert continuous.metrics["timing/retrieve_s"] >= 0.5


def test_continuous_schedule_raises_the_retrievers_error(make_scripted_hf, tokenizer, make_prompt):
    from search_rl.rollout.backends import RetrieverError

    class Failing:
        async def search(self, queries, topk=None):
            raise RetrieverError("down")

    prompts, scripts = _scripts(make_prompt)
    engine = make_scripted_hf(scripts)
    cfg = RolloutConfig(search_turns=2, max_turn_tokens=128, max_obs_tokens=64, max_response_tokens=512)
    with pytest.raises(RetrieverError, match="down"):
        LLMGenerationManager(engine, tokenizer, Failing(), cfg).generate(prompts)


def test_schedule_is_checked():
    with pytest.raises(ValueError, match="rollout.schedule"):
        RolloutConfig(schedule="sometimes")


def test_continuous_on_an_engine_without_working_sessions_runs_turns_and_says_so_once(
    make_scripted_hf, make_prompt, monkeypatch, caplog
):
    from search_rl.rollout.engines import choice

    monkeypatch.setattr(choice, "_warned", set())
    prompts, scripts = _scripts(make_prompt)
    engine = make_scripted_hf(scripts)
    assert choice.schedule_that_runs("continuous", engine) == "continuous"
    monkeypatch.setattr(type(engine), "supports_sessions", property(lambda self: False))  # a sliding-window cache
    with caplog.at_level("WARNING", logger=choice.__name__):
        ran = [choice.schedule_that_runs("continuous", engine) for _ in range(2)]
        assert choice.schedule_that_runs("turns", object()) == "turns"
    assert ran == ["turns", "turns"]
    [warning] = [r.getMessage() for r in caplog.records if r.name == choice.__name__]
    assert warning.startswith(f"rollout.schedule=continuous: {type(engine).__name__} cannot open decode sessions")
