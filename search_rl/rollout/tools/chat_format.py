"""The chat-template format (``rollout.action_format=chat_template``): tools in the format the model was trained with.

- The prompt lists the tools through the tokenizer's own template (``apply_chat_template(messages, tools=[...])``,
  ``prompt_data.encode_prompt`` with ``tools``; the entry points pass ``loading.prompt_tools``).
- A turn is one assistant message, ended by the template's end-of-message token (EOS). Its calls are Hermes/Qwen
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, several allowed; a message without one is the
  final answer (the text inside ``<answer>`` tags if any, else the message without its ``<think>`` block).
- Results are ``role: tool`` messages rendered by the template. Token-in/token-out: the sampled ids stay as they
  are; only the template's text between the assistant's content and the next assistant turn is added (mask 0). That
  text is found once per shape by rendering a stand-in conversation with and without the tool messages (their
  contents are slot markers) and cutting the difference at the markers, so any template that renders a
  conversation's prefix the same way works; one that does not is refused with the reason.
- A malformed call (bad JSON, unknown tool, arguments that do not fit the schema, an unclosed ``<tool_call>``) is
  answered by a tool message that says what is wrong, and counted in ``rollout/tool_errors``; it never raises.
- A message with neither a call nor answer text (only a ``<think>`` block, or nothing) is an invalid action, as a
  turn without a tag is under Search-R1's format: a tool message says so and the loop goes on while turns remain.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from search_rl.prompt_data import encode_prompt
from search_rl.rollout.observations import Observation, ObservationBuilder, water_fill
from search_rl.rollout.tools.base import Tool, ToolCall, ToolResult, TurnAction, argument_problem, function_schema
from search_rl.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    NO_RESULTS_TEXT,
    THINK_CLOSE,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    format_docs,
)

_CALL_RE = re.compile(f"{re.escape(TOOL_CALL_OPEN)}(.*?){re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)
_ANSWER_RE = re.compile(f"{re.escape(ANSWER_OPEN)}(.*?){re.escape(ANSWER_CLOSE)}", re.DOTALL)
_USER, _ASSISTANT = "\x1fUSER\x1f", "\x1fASSISTANT\x1f"
CALL_SHAPE = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'
EMPTY_REPLY_FEEDBACK = (
    f"The reply held neither a tool call nor an answer. Call a tool with {CALL_SHAPE}, or reply with the answer."
)


def _slot(i: int) -> str:
    return f"\x1fTOOL{i}\x1f"


class ChatTemplateFormat:
    """Parses Hermes-style tool calls and renders results as the template's tool messages.

    Args:
        tokenizer: the policy's tokenizer; it needs a chat template that renders ``tools`` and ``role: tool``.
        tools: every tool the model may call.

    Raises:
        ValueError: the tokenizer has no chat template, or its template ignores the tools or tool messages.
    """

    stop: tuple[str, ...] = ()
    """No stop string: a turn ends with the message's end token, which the engine stops on (EOS)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Tool]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "rollout.action_format=chat_template needs a tokenizer with a chat template; this one has none (use "
                "action_format=tags)"
            )
        self.tokenizer = tokenizer
        self.tools = {t.name: t for t in tools}
        self.schemas: list[Any] = [function_schema(t) for t in tools]
        self.eos_text = str(tokenizer.eos_token or "")
        listed = self._render([{"role": "user", "content": _USER}], True)
        missing = [name for name in self.tools if name not in listed]
        if missing:
            raise ValueError(
                f"rollout.action_format=chat_template: the tokenizer's chat template does not render the tools "
                f"{missing} (it ignores tools=); use a model whose template lists tools (Qwen2.5, Qwen3, Hermes) "
                "or action_format=tags"
            )
        self._frames: dict[tuple[tuple[str, ...], bool], list[tuple[str, str]]] = {}
        self._builders: dict[tuple[str, str], ObservationBuilder] = {}
        self.min_obs_tokens = self._builder(*self._frame(("search",), False)[0]).min_tokens

    def encode_prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """``prompt_data.encode_prompt`` with this format's tools listed."""
        return encode_prompt(self.tokenizer, messages, self.schemas)

    def parse(self, text: str) -> TurnAction:
        """The turn's tool calls, or its final answer when it has none."""
        raws = _CALL_RE.findall(text)
        calls = [self._call(raw) for raw in raws]
        if text.count(TOOL_CALL_OPEN) > len(raws):
            calls.append(ToolCall("", {}, error=f"a {TOOL_CALL_OPEN} was not closed; write {CALL_SHAPE}"))
        if calls:
            return TurnAction("call", calls=tuple(calls), search_attempt=any(c.name == "search" for c in calls))
        answer = self._answer(text)
        if answer is None:  # only thoughts, or nothing: as Search-R1's tags treat a turn without an action
            return TurnAction("invalid", feedback=EMPTY_REPLY_FEEDBACK)
        return TurnAction("answer", answer=answer)

    def _answer(self, text: str) -> str | None:
        if m := _ANSWER_RE.search(text):
            answer = m.group(1)
        else:
            answer = text.rsplit(THINK_CLOSE, 1)[-1]
            if self.eos_text and answer.endswith(self.eos_text):
                answer = answer[: -len(self.eos_text)]
        return answer.strip() or None

    def _call(self, raw: str) -> ToolCall:
        try:
            call = json.loads(raw)
        except json.JSONDecodeError as e:
            return ToolCall("", {}, error=f"the tool call is not valid JSON ({e.msg}); write {CALL_SHAPE}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ToolCall("", {}, error=f'a tool call needs a "name" and "arguments"; write {CALL_SHAPE}')
        name, arguments = call["name"], call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        tool = self.tools.get(name)
        if tool is None:
            return ToolCall(name, {}, error=f"unknown tool {name!r}; the tools are {', '.join(self.tools)}")
        problem = argument_problem(tool.parameters, arguments)
        if problem is not None:
            return ToolCall(name, {}, error=f"{name}: {problem}")
        return ToolCall(name, arguments)

    def feedback(self, text: str, room: int) -> Observation | None:
        """A message the model must read without a call behind it, sent as a tool message."""
        out = self.results([ToolResult(text, failed=True)], ["feedback"], room, eos_sampled=True)
        return None if out is None else out[0]

    def results(
        self, results: Sequence[ToolResult], names: Sequence[str], room: int, *, eos_sampled: bool = True
    ) -> list[Observation] | None:
        """One observation per tool message (the first also closes the assistant's message, the last opens the next
        assistant turn), sharing ``room`` tokens; None when even their frames do not fit.

        Args:
            results: the turn's results, in call order.
            names: the tool of each result.
            room: tokens available.
            eos_sampled: the turn ended with the EOS token (the template's end-of-message text is then sampled,
                not added).
        """
        frames = self._frame(tuple(names), eos_sampled)
        builders = [self._builder(p, s) for p, s in frames]
        bodies = [_body(r) for r in results]
        full = [
            b.min_tokens + len(self.tokenizer.encode(t, add_special_tokens=False))
            for b, t in zip(builders, bodies, strict=True)
        ]
        allow = water_fill(full, room)
        out = []
        for b, r, body, a in zip(builders, results, bodies, allow, strict=True):
            obs = b.passages(r.passages, a) if r.passages and not r.failed else b.text(body, a)
            if obs is None:
                return None
            out.append(obs)
        return out

    def _builder(self, prefix: str, suffix: str) -> ObservationBuilder:
        if (prefix, suffix) not in self._builders:
            self._builders[prefix, suffix] = ObservationBuilder(
                self.tokenizer, prefix, suffix, show_ids="open" in self.tools
            )
        return self._builders[prefix, suffix]

    def _render(self, conversation: list[dict[str, str]], generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                conversation, tools=self.schemas, add_generation_prompt=generation_prompt, tokenize=False
            )
        )

    def _frame(self, names: tuple[str, ...], eos_sampled: bool) -> list[tuple[str, str]]:
        """(prefix, suffix) of each tool message: the template's text around its content (module docstring)."""
        key = (names, eos_sampled)
        if key in self._frames:
            return self._frames[key]
        conversation = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        before = self._render(conversation, False)
        tools = [{"role": "tool", "name": n, "content": _slot(i)} for i, n in enumerate(names)]
        after = self._render(conversation + tools, True)
        if not after.startswith(before):
            raise ValueError(
                "rollout.action_format=chat_template: the chat template renders a conversation's beginning "
                "differently once tool messages follow, so a tool result cannot be appended token-in/token-out; use "
                "action_format=tags with this model"
            )
        close = before[before.rindex(_ASSISTANT) + len(_ASSISTANT) :]
        if eos_sampled and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text) :]
        delta, pieces, pos = after[len(before) :], [], 0
        for i in range(len(names)):
            at = delta.find(_slot(i), pos)
            if at < 0:
                raise ValueError("rollout.action_format=chat_template: the chat template drops tool messages")
            pieces.append(delta[pos:at])
            pos = at + len(_slot(i))
        pieces[0] = close + pieces[0]
        last = len(names) - 1
        frames = [(pieces[i], delta[pos:] if i == last else "") for i in range(len(names))]
        self._frames[key] = frames
        return frames


def _body(result: ToolResult) -> str:
    """The full text of a result's message (passages in Search-R1's ``Doc i(Title: …)`` layout)."""
    if result.passages is not None and not result.failed:
        return format_docs((p.title, p.text) for p in result.passages) or NO_RESULTS_TEXT
    return result.text
