"""The tool seam: what a tool is (``Tool``), what one call returns (``ToolResult``), and the checks a call's arguments
pass before the tool sees them.

A tool declares itself as an OpenAI function (``name``, ``description``, JSON-schema ``parameters``: what a chat
template renders into the prompt) and answers one call at a time (``call``); a tool that gains from answering a
turn's calls together (search: one batched retriever request) also has ``call_batch``. A tool's own limits and
recoverable failures come back as a ``ToolResult`` with ``failed=True`` and a message the model reads, never as an
exception; only a failure the run must stop on (``RetrieverError`` under ``on_retriever_error=raise``) raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from search_rl.datatypes import Passage
from search_rl.rollout.observations import Observation

TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
"""A tool's name: an identifier (it becomes a function name in a chat template and a tag in the tags format)."""
RESERVED_NAMES = frozenset({"answer", "think", "information", "tool_call", "tool_response"})
"""Names a tool cannot take: the tags of the Search-R1 protocol and of Hermes-style tool calls."""
JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}
"""JSON-schema type names a parameter may declare, and the Python types of a decoded JSON value of each."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool answers for one call.

    ``passages`` (a tuple, even empty) marks a document answer: the tags format lays it out as Search-R1's
    ``Doc i(Title: …) text`` lines, cutting each passage to fit; ``None`` marks a text answer (``text``).
    ``failed``: the call did not do its job (the message is ``text``); counted in ``rollout/tool_errors``.
    """

    text: str = ""
    passages: tuple[Passage, ...] | None = None
    failed: bool = False
    unavailable: bool = False
    """The service behind the tool failed for good (the retriever, after its retries): also counted in
    ``TrajectoryStats.retriever_errors``, so ``train_on_retriever_errors`` and the error-rate breaker see it."""
    retrieval_key: str | None = None
    """The recording entry that answered a search or an ``open`` (``SearchCall.retrieval_key``)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its decoded arguments; ``error`` is set instead when the call
    cannot run (bad JSON, unknown tool, arguments that do not fit the schema) and is what the model is shown."""

    name: str
    arguments: Mapping[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class TurnAction:
    """What one model turn did: ``answer`` (``answer`` set; None when the final message held no text), ``call``
    (``calls``: one or more, some possibly with errors) or ``invalid`` (``feedback``: the text shown instead)."""

    kind: Literal["answer", "call", "invalid"]
    answer: str | None = None
    calls: tuple[ToolCall, ...] = ()
    feedback: str | None = None
    search_attempt: bool = False
    """The turn tried to call ``search``, well formed or not (``TrajectoryStats.search_attempts``)."""


class Tool(Protocol):
    """A tool the model may call. ``parameters`` is a JSON-schema object whose ``properties`` each declare a
    ``type`` (``JSON_TYPES``); the loop checks a call's arguments against it before ``call``."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Answer one call; recoverable failures are a ``ToolResult`` with ``failed=True``."""
        ...


@runtime_checkable
class BatchTool(Protocol):
    """A tool that answers a turn's calls together (in order), e.g. in one retriever request."""

    async def call_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[ToolResult]: ...


class ActionFormat(Protocol):
    """How the model writes its calls and reads their results: ``tag_format.TagFormat`` (Search-R1 tags) or
    ``chat_format.ChatTemplateFormat`` (the model's own chat template)."""

    stop: tuple[str, ...]
    """Stop strings of a turn (besides EOS)."""

    @property
    def min_obs_tokens(self) -> int:
        """Tokens of the frame of one observation with an empty body."""
        ...

    def parse(self, text: str) -> TurnAction:
        """What a turn's new text did."""
        ...

    def feedback(self, text: str, room: int) -> Observation | None:
        """The observation of corrective feedback; None if it does not fit in ``room`` tokens."""
        ...

    def results(
        self, results: Sequence[ToolResult], names: Sequence[str], room: int, *, eos_sampled: bool = True
    ) -> list[Observation] | None:
        """One observation per result, together within ``room`` tokens; None if they do not fit."""
        ...


def describe_call(call: ToolCall) -> str:
    """How a call is recorded (``SearchCall.query``): its one string argument, else its arguments as JSON.

    >>> describe_call(ToolCall("search", {"query": "paris"}))
    'paris'
    >>> describe_call(ToolCall("open", {"doc_id": 7, "page": 2}))
    '{"doc_id": 7, "page": 2}'
    """
    values = list(call.arguments.values())
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return json.dumps(dict(call.arguments), sort_keys=True, ensure_ascii=False)


def function_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI function declaration of ``tool`` (what ``apply_chat_template(tools=[...])`` renders).

    >>> class Echo:
    ...     name, description = "echo", "Repeat the text."
    ...     parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    >>> function_schema(Echo())["function"]["name"]
    'echo'
    """
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def check_tool(tool: object, where: str) -> None:
    """Refuse a tool whose declaration a chat template or the loop could not use.

    Args:
        tool: the built tool.
        where: names the tool's origin in the message (e.g. ``actor_rollout_ref.rollout.tools[0]``).

    Raises:
        TypeError: it lacks ``name``, ``description``, ``parameters`` or an async ``call``.
        ValueError: its name is not an identifier or is reserved, or ``parameters`` is not a JSON-schema object
            whose properties declare known types.
    """
    for attr in ("name", "description", "parameters", "call"):
        if not hasattr(tool, attr):
            raise TypeError(
                f"{where}: {type(tool).__name__} has no {attr!r}; a tool needs name, description, "
                "parameters (a JSON schema) and an async call(arguments)"
            )
    name, params = getattr(tool, "name"), getattr(tool, "parameters")  # noqa: B009 (checked above)
    if not isinstance(name, str) or not TOOL_NAME.match(name) or name in RESERVED_NAMES:
        raise ValueError(
            f"{where}: tool name {name!r} must be an identifier (letters, digits, _), not one of "
            f"{sorted(RESERVED_NAMES)}"
        )
    if not isinstance(params, dict) or params.get("type") != "object" or not isinstance(params.get("properties"), dict):
        raise ValueError(
            f"{where}: tool {name!r}: parameters must be a JSON schema "
            '{"type": "object", "properties": {...}, "required": [...]}'
        )
    for prop, spec in params["properties"].items():
        if not isinstance(spec, dict) or spec.get("type") not in JSON_TYPES:
            raise ValueError(
                f"{where}: tool {name!r}: parameter {prop!r} must declare a type, one of "
                f"{sorted(JSON_TYPES)}; got {spec!r}"
            )
    missing = set(params.get("required", ())) - set(params["properties"])
    if missing:
        raise ValueError(f"{where}: tool {name!r}: required parameters {sorted(missing)} are not in properties")


def argument_problem(parameters: Mapping[str, Any], arguments: object) -> str | None:
    """Why ``arguments`` do not fit the schema ``parameters`` (missing, unknown or mistyped keys), or None.

    >>> schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    >>> argument_problem(schema, {"query": "paris"}) is None
    True
    >>> argument_problem(schema, {"query": 3})
    "argument 'query' must be a string, got 3"
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {arguments!r}"
    props: Mapping[str, Any] = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", ()) if k not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s) {', '.join(map(repr, unknown))}; expected {', '.join(map(repr, props))}"
    for key, value in arguments.items():
        kind = props[key]["type"]
        ok = isinstance(value, JSON_TYPES[kind]) and not (isinstance(value, bool) and kind in ("integer", "number"))
        if not ok:
            return f"argument {key!r} must be a{'n' if kind[0] in 'aeiou' else ''} {kind}, got {value!r}"
    return None
