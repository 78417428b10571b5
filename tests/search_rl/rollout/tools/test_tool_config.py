"""Config-declared tools and the action format: each wrong entry is refused with its position and name, when the
config is built (names, entry-point syntax) or resolved before Ray starts (import, constructor, declaration); the
prompts list the tools only in the chat-template format, and a template that ignores them is refused before Ray.

Run: python -m pytest tests/search_rl/rollout/tools/test_tool_config.py -q
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from search_rl.config import ConfigError, RolloutConfig
from search_rl.config.tools import ToolSpec
from search_rl.configure import load_config
from search_rl.datatypes import Passage
from search_rl.main_sft import load_sft_config
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.backends import BackendIdentity, RecordingRetriever, RecordingStore
from search_rl.rollout.tools import OpenTool, build_tools, check_tool_specs, prompt_tools

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


class Backend:
    """A live search backend of a kind (``http`` serves documents, the others do not)."""

    def __init__(self, kind: str) -> None:
        self.fp = BackendIdentity.of(kind, name="test")

    def fingerprint(self) -> BackendIdentity:
        return self.fp

    async def search(self, queries, topk=None):
        return [[Passage("1", "T", q)] for q in queries]


class DocumentServer(Backend):
    async def documents(self, ids, max_chars):
        return [Passage(i, "T", "article") for i in ids]


def test_open_needs_the_retriever_service():
    for backend in ("http", "replay"):
        check_tool_specs([ToolSpec(name="open")], backend)
    for backend in ("web", "simulated"):
        with pytest.raises(ConfigError, match=f"retriever.backend is {backend}, which serves none; use retriever"):
            check_tool_specs([ToolSpec(name="open")], backend)
    cache = ["retriever.recording.mode=cache", "retriever.recording.path=unused.sqlite"]
    load_config(["actor_rollout_ref.rollout.tools=[{name: open}]", *cache])
    with pytest.raises(ConfigError, match=r"tools\[0\] \(open\): open reads documents"):
        load_config(["actor_rollout_ref.rollout.tools=[{name: open}]", "retriever.backend=web", *cache])


def test_open_is_built_over_a_recording_of_a_backend_that_serves_documents(tmp_path):
    cfg = RolloutConfig(tools=[ToolSpec(name="open")])
    http = DocumentServer("http")
    store = RecordingStore(tmp_path / "r.sqlite")
    recorded = RecordingRetriever(store, "cache", http.fp, 3, http)
    [_, tool] = build_tools(cfg, recorded)
    assert isinstance(tool, OpenTool) and tool.source is recorded
    result = asyncio.run(tool.call({"doc_id": "1"}))
    assert result.passages == (Passage("1", "T", "article"),)
    assert result.retrieval_key == recorded.document_keys(["1"], tool.max_chars)[0], "the call points into the file"
    replay = RecordingRetriever(RecordingStore(tmp_path / "r.sqlite", read_only=True), "replay", http.fp, 3)
    [_, tool] = build_tools(cfg, replay)
    assert asyncio.run(tool.call({"doc_id": "1"})) == result
    for kind in ("web", "simulated"):
        live = Backend(kind)
        for retriever in (live, RecordingRetriever(store, "record", live.fp, 3, live)):
            with pytest.raises(ConfigError, match="serves no documents; open needs the retriever service"):
                build_tools(cfg, retriever)
        replayed = RecordingRetriever(store, "replay", live.fp, 3)
        with pytest.raises(ConfigError, match=f"search backend {kind} \\(recorded, fingerprint {live.fp.id}\\)"):
            build_tools(cfg, replayed)


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
