"""The Search-R1 tags format (``rollout.action_format=tags``, the default): ``<search> q </search>``,
``<answer> a </answer>``, and for every further tool ``<name> argument </name>``; results come back inside
``<information>…</information>`` (``observations.py``). With the search tool alone it parses and renders exactly as
the loop did before the tool seam (``actions.parse_action``).

A further tool's tag holds its one string argument as plain text when its schema has a single string parameter,
else its arguments as a JSON object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from search_rl.rollout.actions import is_search_attempt, parse_action
from search_rl.rollout.observations import Observation, ObservationBuilder
from search_rl.rollout.tools.base import Tool, ToolCall, ToolResult, TurnAction, argument_problem
from search_rl.tags import ANSWER_OPEN, INVALID_ACTION_FEEDBACK, SEARCH_OPEN, STOP_STRINGS


def single_string_parameter(tool: Tool) -> str | None:
    """The name of ``tool``'s only parameter when it is a string, else None."""
    props = tool.parameters.get("properties", {})
    if len(props) == 1:
        ((name, spec),) = props.items()
        if spec.get("type") == "string":
            return str(name)
    return None


class TagFormat:
    """Parses a turn's tags and renders tool results as ``<information>`` observations.

    Args:
        tokenizer: the policy's tokenizer.
        tools: the tools besides ``search`` (each gets a tag of its name).
        max_query_chars: longest accepted search query.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Tool], max_query_chars: int) -> None:
        self.extra = {t.name: t for t in tools if t.name != "search"}
        self.obs = ObservationBuilder(tokenizer, show_ids="open" in self.extra)
        self.max_query_chars = max_query_chars
        self.stop: tuple[str, ...] = STOP_STRINGS + tuple(f"</{name}>" for name in self.extra)
        self._tag = {
            name: re.compile(f"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.DOTALL) for name in self.extra
        }

    @property
    def min_obs_tokens(self) -> int:
        """Tokens of an observation with an empty body."""
        return self.obs.min_tokens

    def parse(self, text: str) -> TurnAction:
        """The turn's first complete action (earliest tag wins)."""
        action = parse_action(text, max_query_chars=self.max_query_chars)
        attempt = is_search_attempt(text, action)
        first = None
        for name, rx in self._tag.items():
            if (m := rx.search(text)) and (first is None or m.start() < first[0]):
                first = (m.start(), name, m.group(1))
        if first is not None and (action.kind == "invalid" or first[0] < _start(text, action.kind)):
            return TurnAction("call", calls=(self._call(first[1], first[2]),), search_attempt=attempt)
        if action.kind == "answer":
            return TurnAction("answer", answer=action.content, search_attempt=attempt)
        if action.kind == "search":
            return TurnAction("call", calls=(ToolCall("search", {"query": action.content}),), search_attempt=attempt)
        return TurnAction("invalid", feedback=action.feedback or INVALID_ACTION_FEEDBACK, search_attempt=attempt)

    def _call(self, name: str, inner: str) -> ToolCall:
        tool = self.extra[name]
        param = single_string_parameter(tool)
        if param is not None:
            return ToolCall(name, {param: inner.strip()})
        try:
            arguments = json.loads(inner)
        except json.JSONDecodeError as e:
            return ToolCall(name, {}, error=f"{name}: the arguments are not valid JSON ({e.msg}); write a JSON object")
        problem = argument_problem(tool.parameters, arguments)
        return ToolCall(name, arguments if isinstance(arguments, dict) else {}, error=problem and f"{name}: {problem}")

    def feedback(self, text: str, room: int) -> Observation | None:
        """Corrective feedback, inserted as is (Search-R1's)."""
        return self.obs.feedback(text, room)

    def results(
        self, results: Sequence[ToolResult], names: Sequence[str], room: int, *, eos_sampled: bool = True
    ) -> list[Observation] | None:
        """The observation of the turn's one result (the tags format makes one call per turn)."""
        (result,) = results
        if result.passages is not None and not result.failed:
            obs = self.obs.passages(result.passages, room)
        else:
            obs = self.obs.text(result.text, room)
        return None if obs is None else [obs]


def _start(text: str, kind: str) -> int:
    """Where the parsed search or answer's opening tag is in ``text`` (the leftmost one, which starts the first
    complete block that ``parse_action`` read)."""
    return text.find(SEARCH_OPEN if kind == "search" else ANSWER_OPEN)
