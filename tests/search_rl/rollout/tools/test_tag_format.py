"""The Search-R1 tags format with tools besides search: parsing (the search/answer path is ``parse_action``'s, the
earliest complete tag wins), stop strings, and the example ``Glossary`` tool declared in ``rollout.tools`` driven
through the agent loop (results in ``<information>``, mask 0, failures counted, calls recorded with their tool).

Run: python -m pytest tests/search_rl/rollout/tools/test_tag_format.py -q
"""

from __future__ import annotations

import asyncio

import pytest
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.config import RolloutConfig
from search_rl.config.tools import ToolSpec
from search_rl.rollout.actions import parse_action
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.rollout.tools.example import Glossary
from search_rl.rollout.tools.tag_format import TagFormat
from search_rl.tags import OBS_PREFIX, OBS_SUFFIX, STOP_STRINGS

GLOSSARY = ToolSpec(
    name="glossary",
    entry_point="search_rl.rollout.tools.example:Glossary",
    settings={"entries": {"RL": "reinforcement learning"}},
)


class Lookup:
    """A tool of two arguments: its tag holds a JSON object."""

    name, description = "lookup", "Look a row up."
    parameters = {
        "type": "object",
        "properties": {"table": {"type": "string"}, "row": {"type": "integer"}},
        "required": ["table", "row"],
    }

    async def call(self, arguments):
        raise AssertionError("not called in these tests")


@pytest.mark.parametrize(
    "text", ["<search> a  b </search>", "x <answer> y </answer>", "<search> </search>", "nothing", "<search> open"]
)
def test_search_and_answer_parse_as_before(tokenizer, text):
    action = parse_action(text)
    turn = TagFormat(tokenizer, [Glossary({})], 512).parse(text)
    expected = {"search": "call", "answer": "answer", "invalid": "invalid"}[action.kind]
    assert turn.kind == expected
    if action.kind == "search":
        assert turn.calls[0].arguments == {"query": action.content}
    if action.kind == "answer":
        assert turn.answer == action.content
    if action.kind == "invalid":
        assert turn.feedback == action.feedback


def test_further_tools_get_tags_and_the_earliest_tag_wins(tokenizer):
    fmt = TagFormat(tokenizer, [Glossary({}), Lookup()], 512)
    assert fmt.stop == (*STOP_STRINGS, "</glossary>", "</lookup>")
    assert TagFormat(tokenizer, [], 512).stop == STOP_STRINGS
    first = fmt.parse("<glossary> RL </glossary><answer> x </answer>")
    assert first.kind == "call" and first.calls[0].arguments == {"term": "RL"}
    assert fmt.parse("<answer> x </answer><glossary> RL </glossary>").kind == "answer"
    ok = fmt.parse('<lookup>{"table": "t", "row": 2}</lookup>').calls[0]
    assert ok.error is None and ok.arguments == {"table": "t", "row": 2}
    assert "not valid JSON" in fmt.parse("<lookup> t 2 </lookup>").calls[0].error
    assert "must be an integer" in fmt.parse('<lookup>{"table": "t", "row": "2"}</lookup>').calls[0].error


def test_the_example_tool_answers_and_fails_as_an_observation():
    tool = Glossary({"RL": "reinforcement learning"})
    assert asyncio.run(tool.call({"term": "rl"})).text == "rl: reinforcement learning"
    missing = asyncio.run(tool.call({"term": "PPO"}))
    assert missing.failed and "No entry" in missing.text


def test_a_config_declared_tool_runs_in_the_loop(tokenizer, make_scripted_engine, make_prompt):
    p = make_prompt("What is RL?")
    script = ["<glossary> RL </glossary>", "<glossary> PPO </glossary>", "<answer> reinforcement learning </answer>"]
    engine = make_scripted_engine({tuple(p): script})
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=32, tools=[GLOSSARY])
    retriever = InMemoryRetriever(shipped_passages(limit=50))
    result = LLMGenerationManager(engine, tokenizer, retriever, cfg).generate([p], seed=0)
    traj = result.trajectories[0]
    obs = [s.text for s in traj.segments if s.kind == "observation"]
    assert obs == [
        OBS_PREFIX + "RL: reinforcement learning" + OBS_SUFFIX,
        OBS_PREFIX + "No entry for 'PPO'." + OBS_SUFFIX,
    ]
    assert [(c.tool, c.query, c.failed) for c in traj.search_calls] == [
        ("glossary", "RL", False),
        ("glossary", "PPO", True),
    ]
    assert traj.num_searches == 0 and retriever.calls == []
    assert all(params.stop == (*STOP_STRINGS, "</glossary>") for _, params, _ in engine.calls)
    assert result.metrics["rollout/tool_calls"] == 2 and result.metrics["rollout/tool_errors"] == 1
    assert traj.final_answer == "reinforcement learning"
