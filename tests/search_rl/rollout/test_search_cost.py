"""The search cost meter and the per-search penalty: the agent loop counts live calls and replayed answers per
rollout, each search call points to its recording entry, and ``reward.search_penalty`` prices searches in the reward.

Run: python -m pytest tests/search_rl/rollout/test_search_cost.py -q
"""

from __future__ import annotations

import asyncio

import pytest
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.batches import PromptBatch
from search_rl.config import RewardConfig, RolloutConfig
from search_rl.config.loading import ConfigError
from search_rl.reward.scoring import score_trajectories
from search_rl.rollout.backends import BackendIdentity, CostMeter, RecordingRetriever, RecordingStore
from search_rl.rollout.generation_manager import LLMGenerationManager

SCRIPT = ["<search> Deadpool 2 release </search>", "<search> Nobel Prize in Physics </search>", "<answer> x </answer>"]


class MeteredMemory(InMemoryRetriever):
    """The in-memory retriever with a fingerprint and a meter (the ``SearchBackend`` surface)."""

    def __init__(self) -> None:
        super().__init__(shipped_passages(), topk=2)
        self.meter = CostMeter()

    def fingerprint(self) -> BackendIdentity:
        return BackendIdentity.of("http", method="memory")

    async def search(self, queries, topk=None):
        self.meter.calls += len(queries)
        self.meter.cost_usd += 0.01 * len(queries)
        return await super().search(queries, topk)


def test_the_loop_meters_live_and_replayed_searches_and_points_to_entries(make_scripted_engine, make_prompt, tokenizer,
                                                                          tmp_path):  # fmt: skip
    prompts = [make_prompt("when was Deadpool 2 released?"), make_prompt("who won physics?")]
    live = MeteredMemory()
    cache = RecordingRetriever(RecordingStore(tmp_path / "r.sqlite"), "cache", live.fingerprint(), 2, live)
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=48, max_obs_tokens=200)

    def roll_out():  # a fresh scripted engine per run: its scripts are consumed turn by turn
        engine = make_scripted_engine({tuple(p): SCRIPT for p in prompts})
        return asyncio.run(LLMGenerationManager(engine, tokenizer, cache, cfg).agenerate(prompts))

    first = roll_out()
    before = cache.meter.totals()
    second = roll_out()
    after = cache.meter.totals()
    # 4 searches each time: in the first run both samples ask the same query in each turn (one live call per
    # distinct query), the second run answers all 4 from the file
    assert before == (2, pytest.approx(0.02), 0) and after == (2, pytest.approx(0.02), 4)
    keys = [c.retrieval_key for t in first.trajectories for c in t.search_calls]
    assert (
        len(keys) == 4 and all(keys) and keys == [c.retrieval_key for t in second.trajectories for c in t.search_calls]
    )
    assert set(RecordingStore(tmp_path / "r.sqlite").get_many(keys)) == set(keys)


def test_search_penalty_prices_each_search(make_scripted_engine, make_prompt, tokenizer):
    with pytest.raises(ConfigError, match=r"reward.search_penalty must be in \[0, 1\)"):
        RewardConfig(search_penalty=1.5)
    prompts = [make_prompt("q1")]
    engine = make_scripted_engine({tuple(prompts[0]): SCRIPT})
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=48)
    manager = LLMGenerationManager(engine, tokenizer, MeteredMemory(), cfg)
    [traj] = manager.generate(prompts).trajectories
    batch = PromptBatch((tuple(prompts[0]),), ("u",), ("nq",), (("x",),), ("q1",), (0,))
    [plain] = score_trajectories([traj], batch, RewardConfig())
    [priced] = score_trajectories([traj], batch, RewardConfig(search_penalty=0.05))
    assert traj.stats.searches == 2 and plain.score == 1.0 and "search_penalty" not in plain.components
    assert priced.score == pytest.approx(0.9) and priced.components["search_penalty"] == pytest.approx(-0.1)
    assert priced.components["em"] == plain.components["em"] == 1.0  # the answer components are untouched
