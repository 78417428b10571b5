"""LLMGenerationManager: the tiny random Llama, forced through scripted turns, with an in-memory retriever over the
shipped corpus (the loop's HTTP path runs against real servers in ``test_search_calls.py``).

Proves the mask invariant by decoding: mask==1 tokens are exactly what the engine sampled (and contain no retrieved
text), mask==0 tokens decode exactly to the inserted observations. Also: stops, the final no-search turn, invalid
action feedback, budgets and their counters, greedy passed through.

Run: python -m pytest tests/search_rl/rollout/test_generation_manager.py -q
"""

from __future__ import annotations

import pytest
import torch
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.batches import TrainBatch
from search_rl.config import RolloutConfig
from search_rl.rollout.backends import RetrieverError
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.tags import (
    EMPTY_QUERY_FEEDBACK,
    INVALID_ACTION_FEEDBACK,
    OBS_PREFIX,
    OBS_SUFFIX,
    RETRIEVER_ERROR_TEXT,
    STOP_STRINGS,
)


@pytest.fixture(scope="module")
def retriever() -> InMemoryRetriever:
    return InMemoryRetriever(shipped_passages(), topk=2)


SEARCH_TWICE_THEN_ANSWER = [
    "<think>I need the film.</think><search> Deadpool 2 release </search>",
    "<think>And the prize.</think><search> Nobel Prize in Physics </search>",
    "<think>Done.</think><answer> May 18, 2018 </answer>",
]


def _manager(engine, tokenizer, retriever, **overrides) -> LLMGenerationManager:
    cfg = RolloutConfig(**({"search_turns": 3, "max_turn_tokens": 64, "max_obs_tokens": 200} | overrides))
    return LLMGenerationManager(engine, tokenizer, retriever, cfg)


def _decode_runs(tokenizer, ids: torch.Tensor, mask: torch.Tensor, value: int) -> list[str]:
    """Decoded text of each maximal run of positions where ``mask == value``."""
    runs, current = [], []
    for tok, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m == value:
            current.append(tok)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_mask_exactness_with_two_searches(tokenizer, retriever, make_scripted_engine, make_prompt):
    p_a, p_b = make_prompt("When was Deadpool 2 released?"), make_prompt("Who won?")
    engine = make_scripted_engine({tuple(p_a): SEARCH_TWICE_THEN_ANSWER, tuple(p_b): ["<answer> nobody </answer>"]})
    result = _manager(engine, tokenizer, retriever).generate([p_a, p_b], seed=0)
    a, b = result.trajectories

    # response ids under mask 1 are exactly the ids the engine sampled, turn by turn, with their log-probs
    sampled = [out[0] for _, _, out in engine.calls]  # sample A is row 0 of every call
    model_ids = a.response_ids[a.response_mask == 1].tolist()
    assert model_ids == [t for g in sampled for t in g.token_ids]
    assert a.rollout_logprobs[a.response_mask == 1].tolist() == [x for g in sampled for x in g.logprobs]  # copied
    assert torch.all(a.rollout_logprobs[a.response_mask == 0] == 0)

    # mask 1 decodes to the scripted turns, mask 0 to the two inserted observations, nothing else
    assert _decode_runs(tokenizer, a.response_ids, a.response_mask, 1) == SEARCH_TWICE_THEN_ANSWER
    observations = _decode_runs(tokenizer, a.response_ids, a.response_mask, 0)
    assert observations == [s.text for s in a.segments if s.kind == "observation"]
    assert len(observations) == 2
    assert all(o.startswith(OBS_PREFIX + "Doc 1(Title: ") and o.endswith(OBS_SUFFIX) for o in observations)
    assert "Deadpool" in observations[0] and "Nobel" in observations[1]
    model_text = "".join(_decode_runs(tokenizer, a.response_ids, a.response_mask, 1))
    assert "<information>" not in model_text and "Doc 1(Title:" not in model_text

    # segments tile the response and agree with the mask
    assert [(s.kind, s.start, s.end) for s in a.segments][0][1] == 0 and a.segments[-1].end == len(a.response_ids)
    for seg in a.segments:
        assert set(a.response_mask[seg.start : seg.end].tolist()) == {1 if seg.kind == "model" else 0}

    assert (a.final_answer, a.stop_reason, a.num_searches) == ("May 18, 2018", "answer", 2)
    assert (a.stats.turns, a.stats.valid_actions, a.stats.invalid_actions, a.stats.finished) == (3, 3, 0, True)
    assert (b.final_answer, b.stats.turns, b.num_searches) == ("nobody", 1, 0)
    assert len(engine.calls[1][0]) == 1, "turn 2 generates only for the still-active sample"
    assert result.metrics["rollout/searches_mean"] == 1.0 and result.metrics["rollout/answer_rate"] == 1.0


def test_nothing_after_the_stop_string_reaches_the_trajectory(tokenizer, retriever, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    script = ["<search> Deadpool 2 </search> LEAKED continuation text", "<answer> x </answer> LEAKED again"]
    engine = make_scripted_engine({tuple(p): script})
    traj = _manager(engine, tokenizer, retriever).generate([p]).trajectories[0]
    full = tokenizer.decode(traj.response_ids)
    assert "LEAKED" not in full
    assert traj.model_texts == ("<search> Deadpool 2 </search>", "<answer> x </answer>")
    assert all(params.stop == STOP_STRINGS for _, params, _ in engine.calls)


def test_final_turn_has_search_off(tokenizer, retriever, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["<search> Deadpool 2 </search>"] * 5})
    traj = _manager(engine, tokenizer, retriever, search_turns=2).generate([p]).trajectories[0]
    kinds = [s.kind for s in traj.segments]
    assert kinds == ["model", "observation", "model", "observation", "model"]
    assert (traj.num_searches, traj.stats.turns, traj.stats.invalid_actions) == (2, 3, 1)
    assert traj.stop_reason == "max_turns" and traj.final_answer is None and not traj.stats.finished
    assert len(engine.calls) == 3


def test_invalid_actions_get_corrective_feedback(tokenizer, retriever, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["I will just talk.", "<search>   </search>", "<answer> ok </answer>"]})
    traj = _manager(engine, tokenizer, retriever).generate([p]).trajectories[0]
    obs = [s.text for s in traj.segments if s.kind == "observation"]
    assert obs == [INVALID_ACTION_FEEDBACK, EMPTY_QUERY_FEEDBACK]
    assert (traj.stats.invalid_actions, traj.stats.valid_actions, traj.num_searches) == (2, 1, 0)
    # the first turn ended with EOS (the script ran out): the EOS token was sampled, so it stays, with mask 1
    first = traj.segments[0]
    assert traj.response_ids[first.end - 1].item() == tokenizer.eos_token_id
    assert traj.final_answer == "ok"


def test_response_budget_ends_episode_and_is_counted(tokenizer, retriever, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["<search> Nobel Prize in Physics </search>"] * 4})
    mgr = _manager(engine, tokenizer, retriever, max_response_tokens=90, max_obs_tokens=60, max_turn_tokens=40)
    traj = mgr.generate([p]).trajectories[0]
    assert len(traj.response_ids) <= 90
    assert traj.stop_reason == "max_response_tokens" and traj.stats.response_budget_hit
    assert traj.stats.obs_tokens_truncated > 0
    obs = [s.text for s in traj.segments if s.kind == "observation"]
    assert obs and all(o.endswith(OBS_SUFFIX) for o in obs), "observation text is cut, never its closing tag"


def test_prompt_budget(tokenizer, retriever, make_scripted_engine):
    long_prompt = tokenizer.encode("word " * 60)
    engine = make_scripted_engine({tuple(long_prompt[-30:]): ["<answer> a </answer>"]})
    with pytest.raises(ValueError, match="over rollout.max_prompt_tokens=30"):
        _manager(engine, tokenizer, retriever, max_prompt_tokens=30).generate([long_prompt])
    traj = (
        _manager(engine, tokenizer, retriever, max_prompt_tokens=30, prompt_truncation="left")
        .generate([long_prompt])
        .trajectories[0]
    )
    assert traj.prompt_ids.tolist() == long_prompt[-30:]
    assert traj.stats.prompt_tokens_truncated == len(long_prompt) - 30


def test_greedy_and_no_search(tokenizer, retriever, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    engine = make_scripted_engine({tuple(p): ["<search> Deadpool </search>", "<answer> a </answer>"]})
    traj = _manager(engine, tokenizer, retriever, search_turns=0).generate([p], greedy=True).trajectories[0]
    assert len(engine.calls) == 1 and engine.calls[0][1].greedy
    assert traj.stop_reason == "max_turns" and traj.num_searches == 0


def test_budgets_checked_at_start(tokenizer, tiny_engine, retriever):
    with pytest.raises(ValueError, match="exceeds the model's context of 4096"):
        _manager(tiny_engine, tokenizer, retriever, max_prompt_tokens=3000, max_response_tokens=2000)
    with pytest.raises(ValueError, match="max_turn_tokens=300 exceeds"):
        RolloutConfig(max_turn_tokens=300, max_response_tokens=200)
    with pytest.raises(ValueError, match="no retriever"):
        LLMGenerationManager(tiny_engine, tokenizer, None, RolloutConfig())


def test_batch_collation_keeps_the_mask(tokenizer, retriever, make_scripted_engine, make_prompt):
    p_a, p_b = make_prompt("first question"), make_prompt("b")
    engine = make_scripted_engine({tuple(p_a): SEARCH_TWICE_THEN_ANSWER, tuple(p_b): ["<answer> b </answer>"]})
    trajs = _manager(engine, tokenizer, retriever).generate([p_a, p_b]).trajectories
    batch = TrainBatch.from_trajectories(trajs, ["q", "q"], ["nq", "nq"], pad_token_id=tokenizer.pad_token_id)
    for i, t in enumerate(trajs):
        n = len(t.response_ids)
        assert torch.equal(batch.response_mask[i, :n], t.response_mask) and batch.response_mask[i, n:].sum() == 0
        assert torch.equal(batch.response_ids[i, :n], t.response_ids)
        real = batch.input_ids[i][batch.attention_mask[i] == 1]
        assert torch.equal(real, torch.cat([t.prompt_ids, t.response_ids]))
        assert batch.position_ids[i][batch.attention_mask[i] == 1].tolist() == list(range(len(real)))


def test_a_failed_search_is_raised_or_observed_as_configured(tokenizer, make_scripted_engine, make_prompt):
    p = make_prompt("q")
    script = ["<search> Deadpool 2 </search>", "<answer> x </answer>"]
    failing = InMemoryRetriever(shipped_passages(limit=200), topk=2, failing=["Deadpool 2"])
    with pytest.raises(RetrieverError, match="set to fail"):
        _manager(make_scripted_engine({tuple(p): script}), tokenizer, failing).generate([p])
    observed = _manager(make_scripted_engine({tuple(p): script}), tokenizer, failing, on_retriever_error="observe")
    traj = observed.generate([p]).trajectories[0]
    observations = [s.text for s in traj.segments if s.kind == "observation"]
    assert observations == [OBS_PREFIX + RETRIEVER_ERROR_TEXT + OBS_SUFFIX]
    assert traj.search_calls[0].failed and traj.search_calls[0].passages == ()
    assert traj.final_answer == "x" and failing.calls == [["Deadpool 2"], ["Deadpool 2"]]
