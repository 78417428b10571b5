"""Config-declared tools and the action format: each wrong entry is refused with its position and name, when the
config is built (names, entry-point syntax) or resolved before Ray starts (import, constructor, declaration); the
prompts list the tools only in the chat-template format, and a template that ignores them is refused before Ray.

Run: python -m pytest tests/search_rl/rollout/tools/test_tool_config.py -q
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from search_rl.config import ConfigError, RolloutConfig
from search_rl.config.tools import ToolSpec
from search_rl.configure import load_config
from search_rl.main_sft import load_sft_config
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.tools import check_tool_specs, prompt_tools

EXAMPLE = "search_rl.rollout.tools.example:Glossary"


class BadSchema:
    name, description = "bad", "A tool with a parameter of no type."
    parameters = {"type": "object", "properties": {"q": {}}}

    async def call(self, arguments):
        raise AssertionError


def test_action_format_is_checked():
    with pytest.raises(ConfigError, match=r"rollout.action_format must be one of \('tags', 'chat_template'\)"):
        RolloutConfig(action_format="xml")


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([ToolSpec(name="search")], r"tools\[0\] \(search\): name must be an identifier other than 'search'"),
        ([ToolSpec(name="my tool", entry_point=EXAMPLE)], "name must be an identifier"),
        ([ToolSpec(name="open"), ToolSpec(name="open")], r"tools\[1\] \(open\): a second tool named 'open'"),
        ([ToolSpec(name="calc")], r"tools\[0\] \(calc\): no entry_point, and 'calc' is not a built-in"),
        ([ToolSpec(name="calc", entry_point="calc.Calc")], "entry_point must be 'package.module:Class'"),
    ],
)
def test_entries_are_checked_when_the_config_is_built(specs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutConfig(tools=specs)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            ToolSpec(name="glossary", entry_point="no_such_pkg.tools:Glossary"),
            r"\[0\] \(glossary\).*cannot be imported",
        ),
        (ToolSpec(name="glossary", entry_point="search_rl.rollout.tools.example:Nope"), "cannot be imported"),
        (ToolSpec(name="glossary", entry_point=EXAMPLE, settings={"rows": 1}), "do not fit the tool's constructor"),
        (ToolSpec(name="words", entry_point=EXAMPLE, settings={"entries": {}}), "the class calls itself 'glossary'"),
        (ToolSpec(name="bad", entry_point=f"{__name__}:BadSchema"), "parameter 'q' must declare a type"),
        (ToolSpec(name="open", settings={"max_chars": 0}), "max_chars must be >= 1"),
    ],
)
def test_entries_are_built_once_before_ray(spec, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        check_tool_specs([spec])


def test_open_needs_the_retriever_service():
    check_tool_specs([ToolSpec(name="open")], "http")
    with pytest.raises(ConfigError, match="open reads documents from the retriever service"):
        check_tool_specs([ToolSpec(name="open")], "web")


def test_tools_load_from_the_command_line():
    entry = "{name: glossary, entry_point: '" + EXAMPLE + "', settings: {entries: {RL: reinforcement learning}}}"
    cfg = load_config(
        ["actor_rollout_ref.rollout.action_format=chat_template", f"actor_rollout_ref.rollout.tools=[{entry}]"]
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.action_format == "chat_template"
    assert rollout.tools[0].name == "glossary" and rollout.tools[0].settings == {
        "entries": {"RL": "reinforcement learning"}
    }
    assert rollout.search_loop_config().tools == rollout.tools
    bad = "{name: glossary, entry_point: 'search_rl.rollout.tools.example:Nope'}"
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.tools\[0\] \(glossary\)"):
        load_config([f"actor_rollout_ref.rollout.tools=[{bad}]"])


def test_prompts_list_the_tools_only_in_the_chat_template_format(tokenizer, qwen_tokenizer):
    qwen = qwen_tokenizer
    glossary = ToolSpec(name="glossary", entry_point=EXAMPLE, settings={"entries": {"RL": "reinforcement learning"}})
    chat = RolloutConfig(action_format="chat_template", tools=[glossary])
    assert prompt_tools(RolloutConfig(tools=[glossary]), qwen) is None  # tags: the protocol is in the prompt's text
    assert prompt_tools(replace(chat, search_turns=0), qwen) is None  # no tool turns, no tools listed
    schemas = prompt_tools(chat, qwen)
    assert schemas is not None and [s["function"]["name"] for s in schemas] == ["search", "glossary"]
    text = qwen.decode(encode_prompt(qwen, [{"role": "user", "content": "q"}], schemas))
    assert '"name": "glossary"' in text and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ConfigError, match="does not render the tools"):  # SmolLM2's template ignores tools=
        prompt_tools(chat, tokenizer)


def test_the_warm_start_refuses_the_chat_template_format():
    with pytest.raises(ConfigError, match="the warm start builds its examples from the rows' turns"):
        load_sft_config(["actor_rollout_ref.rollout.action_format=chat_template"])
