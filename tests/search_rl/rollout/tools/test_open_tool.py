"""The ``open`` tool against a real retriever server (BM25 over the shipped corpus): the client's ``documents``, and
a rollout that searches, opens a hit by the id its header shows, and answers; the same rollout recorded, then
replayed from the recording alone.

Run: python -m pytest tests/search_rl/rollout/tools/test_open_tool.py -q
"""

from __future__ import annotations

import asyncio

from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.config.search_backends import RecordingConfig
from search_rl.config.tools import ToolSpec
from search_rl.datatypes import Passage
from search_rl.rollout.backends import RecordingStore, RetrieverClient, build_retriever
from search_rl.rollout.generation_manager import LLMGenerationManager


def test_the_client_fetches_articles(retriever_url: str):
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url))
    found = asyncio.run(client.documents(["1", "no-such-id"], 30))
    assert found == [Passage("1", "Deadpool 2", "Deadpool 2 is scheduled to be "), None]


SCRIPT = [
    "<search> Deadpool 2 </search>",
    "<open> 1 </open>",
    "<open> nope </open>",
    "<answer> May 18, 2018 </answer>",
]


def test_a_rollout_opens_a_search_hit(retriever_url: str, tokenizer, make_scripted_engine, make_prompt):
    p = make_prompt("When was Deadpool 2 released?")
    engine = make_scripted_engine({tuple(p): SCRIPT})
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=32, tools=[ToolSpec(name="open", settings={"max_chars": 500})])
    retriever = build_retriever(RetrieverClientConfig(url=retriever_url, topk=2))
    result = LLMGenerationManager(engine, tokenizer, retriever, cfg).generate([p], seed=0)
    traj = result.trajectories[0]
    obs = [s.text for s in traj.segments if s.kind == "observation"]
    assert "(Title: Deadpool 2; id: 1)" in obs[0], "with open on, search results show their ids"
    assert obs[1].startswith("\n\n<information>Doc 1(Title: Deadpool 2; id: 1) Deadpool 2 is scheduled")
    assert "Deadpool 3, is in development" in obs[1]
    assert "No document has the id 'nope'" in obs[2]
    assert [(c.tool, c.query, c.failed) for c in traj.search_calls] == [
        ("search", "Deadpool 2", False),
        ("open", "1", False),
        ("open", "nope", True),
    ]
    assert traj.num_searches == 1 and result.metrics["rollout/tool_errors"] == 1


def test_a_recorded_rollout_replays_its_opens(
    retriever_url: str, tokenizer, make_scripted_engine, make_prompt, tmp_path
):
    p = make_prompt("When was Deadpool 2 released?")
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=32, tools=[ToolSpec(name="open", settings={"max_chars": 500})])
    rec = RecordingConfig(mode="cache", path=str(tmp_path / "r.sqlite"))
    runs = []
    for backend in ("http", "replay"):  # replay: the recording alone answers, without the service
        retriever = build_retriever(RetrieverClientConfig(url=retriever_url, topk=2, backend=backend, recording=rec))
        manager = LLMGenerationManager(make_scripted_engine({tuple(p): SCRIPT}), tokenizer, retriever, cfg)
        runs.append(manager.generate([p], seed=0).trajectories[0])
    recorded, replayed = runs
    assert replayed.segments == recorded.segments and replayed.search_calls == recorded.search_calls
    assert (retriever.hits, retriever.document_hits, retriever.document_misses) == (1, 2, 0)
    keys = [c.retrieval_key for c in recorded.search_calls]
    stored = RecordingStore(rec.path, read_only=True).get_documents(keys)
    assert all(keys) and set(stored) == set(keys[1:]), "each open points to its document in the recording"
    assert stored[keys[1]].passage is not None and stored[keys[2]].passage is None  # 'nope' replays as unknown
