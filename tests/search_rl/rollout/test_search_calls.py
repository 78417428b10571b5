"""What the agent loop keeps for search diagnostics: attempts, the queries sent, the passages as shown, failures.

The tiny random Llama is forced through scripted turns against a real retriever (BM25 over the shipped corpus).

Run: python -m pytest tests/search_rl/rollout/test_search_calls.py -q
"""

from __future__ import annotations

import asyncio

import pytest

from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.tags import doc_header

pytestmark = pytest.mark.integration


def _manager(engine, tokenizer, url, **overrides) -> LLMGenerationManager:
    cfg = RolloutConfig(**({"search_turns": 3, "max_turn_tokens": 64, "max_obs_tokens": 300} | overrides))
    client_cfg = RetrieverClientConfig(url=url, topk=2, retry_window_s=0.0, max_retries=0)
    return LLMGenerationManager(engine, tokenizer, RetrieverClient(client_cfg), cfg)


def test_attempts_queries_and_shown_passages(tokenizer, retriever_url, make_scripted_engine, make_prompt):
    p_a, p_b = make_prompt("When was Deadpool 2 released?"), make_prompt("Who won the prize?")
    script_a = [
        "<search> Deadpool 2 release </search>",
        "<search> deadpool 2  Release? </search>",  # the same query after normalisation
        "<think>hm</think><search> unclosed query",  # an attempt the parser rejects
        "<answer> May 2018 </answer>",
    ]
    script_b = ["<search> Nobel Prize in Physics </search>"] * 4  # the 4th turn is the final one: search is off
    engine = make_scripted_engine({tuple(p_a): script_a, tuple(p_b): script_b})
    a, b = _manager(engine, tokenizer, retriever_url).generate([p_a, p_b], seed=0).trajectories

    assert (a.stats.search_attempts, a.num_searches) == (3, 2)
    assert [c.query for c in a.search_calls] == ["Deadpool 2 release", "deadpool 2 Release?"]
    assert (b.stats.search_attempts, b.num_searches, len(b.search_calls)) == (4, 3, 3)
    assert not any(c.failed for c in a.search_calls + b.search_calls)

    # the passages kept are exactly the ones the model read, in the observation that followed each search
    observations = [s.text for s in a.segments if s.kind == "observation"]
    assert len(observations) == 3  # two searches and the invalid-action feedback
    for call, obs in zip(a.search_calls, observations[:2], strict=True):
        assert len(call.passages) == 2
        for k, passage in enumerate(call.passages, start=1):
            assert f"{doc_header(k, passage.title)} {passage.text}" in obs
    assert "Deadpool" in a.search_calls[0].passages[0].title + a.search_calls[0].passages[0].text


def test_passages_cut_by_the_budget_are_kept_as_shown(tokenizer, retriever_url, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["<search> Nobel Prize in Physics </search>", "<answer> x </answer>"]})
    traj = _manager(engine, tokenizer, retriever_url, max_obs_tokens=60).generate([p]).trajectories[0]
    assert traj.stats.obs_tokens_truncated > 0
    full = asyncio.run(
        RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2)).search([traj.search_calls[0].query])
    )[0]
    (call,) = traj.search_calls
    obs = next(s.text for s in traj.segments if s.kind == "observation")
    assert [p.id for p in call.passages] == [p.id for p in full[: len(call.passages)]]
    cut = 0
    for k, (shown, whole) in enumerate(zip(call.passages, full, strict=False), start=1):
        assert whole.text.startswith(shown.text) and f"{doc_header(k, shown.title)} {shown.text}" in obs
        cut += len(shown.text) < len(whole.text)
    assert cut >= 1, "the budget cut at least one passage, and the call keeps the cut text"


def test_a_failed_search_is_kept_as_failed(tokenizer, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["<search> anything </search>", "<answer> x </answer>"]})
    mgr = _manager(engine, tokenizer, "http://127.0.0.1:9", on_retriever_error="observe")  # nothing listens there
    traj = mgr.generate([p]).trajectories[0]
    assert traj.stats.retriever_errors == 1 and traj.num_searches == 1
    assert [(c.query, c.passages, c.failed) for c in traj.search_calls] == [("anything", (), True)]
