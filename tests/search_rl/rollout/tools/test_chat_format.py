"""``rollout.action_format=chat_template``: tool calls in the model's own chat template (Qwen2.5's, over the SmolLM2
tokenizer), driven through the agent loop by the tiny random Llama forced through scripted turns.

Proves: the prompt lists the tools; the trained tokens (mask 1) are exactly the sampled ones; prompt + response
decode to exactly what the template renders for the same conversation (assistant turns, ``role: tool`` results); a
turn may make several calls; malformed calls (bad JSON, unknown tool, wrong argument type, unclosed tag) become tool
messages saying what is wrong and count in ``rollout/tool_errors``, never an exception; the final turn has tools off.

Run: python -m pytest tests/search_rl/rollout/tools/test_chat_format.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.config import RolloutConfig
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.rollout.tools import SearchTool, function_schema
from search_rl.rollout.tools.chat_format import ChatTemplateFormat
from search_rl.tags import format_docs


@pytest.fixture(scope="module")
def retriever() -> InMemoryRetriever:
    return InMemoryRetriever(shipped_passages(limit=400), topk=2, failing=["broken"])


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _setup(qwen_tokenizer, retriever, make_scripted_engine, scripts, **overrides):
    cfg = RolloutConfig(
        **(
            {"search_turns": 3, "max_turn_tokens": 64, "max_obs_tokens": 200, "action_format": "chat_template"}
            | overrides
        )
    )
    schemas = [function_schema(SearchTool(retriever))]
    questions = list(scripts)
    prompts = [encode_prompt(qwen_tokenizer, [{"role": "user", "content": q}], schemas) for q in questions]
    engine = make_scripted_engine({tuple(p): scripts[q] for p, q in zip(prompts, questions, strict=True)})
    return LLMGenerationManager(engine, qwen_tokenizer, retriever, cfg), engine, prompts


def test_prompt_lists_the_tools(qwen_tokenizer, retriever):
    fmt = ChatTemplateFormat(qwen_tokenizer, [SearchTool(retriever)])
    text = qwen_tokenizer.decode(fmt.encode_prompt([{"role": "user", "content": "q"}]))
    assert '"name": "search"' in text and text.endswith("<|im_start|>assistant\n")


def test_trained_tokens_are_the_sampled_ones_and_the_layout_is_the_templates(
    qwen_tokenizer, retriever, make_scripted_engine
):
    turns = [
        f"<think>Look it up.</think>{call('search', query='Deadpool 2 release')}",
        "<answer> May 18, 2018 </answer>",
    ]
    manager, engine, prompts = _setup(qwen_tokenizer, retriever, make_scripted_engine, {"When?": turns})
    result = manager.generate(prompts, seed=0)
    traj = result.trajectories[0]

    sampled = [out[0] for _, _, out in engine.calls]
    assert traj.response_ids[traj.response_mask == 1].tolist() == [t for g in sampled for t in g.token_ids]
    assert all(g.token_ids[-1] == qwen_tokenizer.eos_token_id for g in sampled), "turns end with <|im_end|>"
    assert all(params.stop == () for _, params, _ in engine.calls)

    (search,) = traj.search_calls
    assert (search.tool, search.query, search.failed) == ("search", "Deadpool 2 release", False)
    content = format_docs((p.title, p.text) for p in search.passages)
    conversation = [
        {"role": "user", "content": "When?"},
        {"role": "assistant", "content": turns[0]},
        {"role": "tool", "name": "search", "content": content},
        {"role": "assistant", "content": turns[1]},
    ]
    rendered = qwen_tokenizer.apply_chat_template(
        conversation, tools=[function_schema(SearchTool(retriever))], tokenize=False
    )
    full = qwen_tokenizer.decode(torch.cat([traj.prompt_ids, traj.response_ids]).tolist())
    assert full + "\n" == rendered, "prompt + response are the template's rendering (the last newline follows EOS)"
    observation = [s.text for s in traj.segments if s.kind == "observation"]
    assert observation == [
        "\n<|im_start|>user\n<tool_response>\n" + content + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ]
    assert (traj.final_answer, traj.stop_reason, traj.num_searches) == ("May 18, 2018", "answer", 1)
    assert result.metrics["rollout/tool_calls"] == 1 and result.metrics["rollout/tool_errors"] == 0


def test_several_calls_and_malformed_ones_become_observations(qwen_tokenizer, retriever, make_scripted_engine):
    turns = [
        call("search", query="Deadpool 2") + "\n" + call("search", query="Nobel Prize in Physics"),
        "<tool_call>\n{not json}\n</tool_call>" + call("calculator", x=1) + call("search", query=3),
        '<tool_call>\n{"name": "search"',
        "It was in 2018.",
    ]
    manager, _, prompts = _setup(qwen_tokenizer, retriever, make_scripted_engine, {"q": turns}, max_turn_tokens=128)
    result = manager.generate(prompts, seed=0)
    traj = result.trajectories[0]
    assert [c.query for c in traj.search_calls] == ["Deadpool 2", "Nobel Prize in Physics"]
    obs = [s.text for s in traj.segments if s.kind == "observation"]
    assert obs[0].count("<tool_response>") == 2 and obs[0].count("<|im_start|>user") == 1
    assert "not valid JSON" in obs[1] and "unknown tool 'calculator'" in obs[1] and "must be a string" in obs[1]
    assert obs[1].count("<tool_response>") == 3
    assert "was not closed" in obs[2]
    assert result.metrics["rollout/tool_errors"] == 4 and result.metrics["rollout/tool_calls"] == 6
    assert (traj.stats.valid_actions, traj.stats.invalid_actions) == (2, 2)
    assert traj.final_answer == "It was in 2018." and traj.stop_reason == "answer"


def test_final_turn_has_tools_off_and_failures_are_observed(qwen_tokenizer, retriever, make_scripted_engine):
    turns = [call("search", query="broken"), call("search", query="Deadpool 2")]
    manager, _, prompts = _setup(
        qwen_tokenizer, retriever, make_scripted_engine, {"q": turns}, search_turns=1, on_retriever_error="observe"
    )
    traj = manager.generate(prompts, seed=0).trajectories[0]
    assert traj.search_calls[0].failed and traj.stats.retriever_errors == 1
    assert traj.stop_reason == "max_turns" and traj.stats.invalid_actions == 1


def test_a_reply_without_call_or_answer_is_invalid_and_the_loop_goes_on(
    qwen_tokenizer, retriever, make_scripted_engine
):
    turns = ["<think>Hmm.</think>", "<answer> May 18, 2018 </answer>"]
    manager, _, prompts = _setup(qwen_tokenizer, retriever, make_scripted_engine, {"q": turns})
    traj = manager.generate(prompts, seed=0).trajectories[0]
    (feedback,) = [s.text for s in traj.segments if s.kind == "observation"]
    assert "neither a tool call nor an answer" in feedback and "<tool_response>" in feedback
    assert (traj.stats.valid_actions, traj.stats.invalid_actions) == (1, 1)
    assert (traj.final_answer, traj.stop_reason) == ("May 18, 2018", "answer")


def test_a_template_without_tools_is_refused(tokenizer, retriever):
    with pytest.raises(ValueError, match="does not render the tools"):
        ChatTemplateFormat(tokenizer, [SearchTool(retriever)])
