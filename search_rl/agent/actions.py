"""The tag protocol and action parsing: what the model may do in a turn (search or answer), read from its new text.

Tag strings and the corrective feedback texts are constants here; nothing else in the code spells them out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"

STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)
"""The engine stops a turn right after either closing tag."""

INVALID_ACTION_FEEDBACK = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
"""Shown after a turn with no complete ``<search>``/``<answer>`` (Search-R1's wording, which its models know)."""
EMPTY_QUERY_FEEDBACK = "\nMy previous search query was empty. I should put a query between <search> and </search>.\n"
"""Shown after ``<search></search>`` with nothing (but whitespace) inside."""
LONG_QUERY_FEEDBACK = "\nMy previous search query was too long. I should search for a short query.\n"
"""Shown after a query over ``rollout.max_query_chars``."""
EMPTY_ANSWER_FEEDBACK = "\nMy previous answer was empty. I should put the answer between <answer> and </answer>.\n"
"""Shown after ``<answer></answer>`` with nothing inside."""

ActionKind = Literal["search", "answer", "invalid"]

_SEARCH_RE = re.compile(f"{re.escape(SEARCH_OPEN)}(.*?){re.escape(SEARCH_CLOSE)}", re.DOTALL)
_ANSWER_RE = re.compile(f"{re.escape(ANSWER_OPEN)}(.*?){re.escape(ANSWER_CLOSE)}", re.DOTALL)


@dataclass(frozen=True)
class Action:
    """A parsed turn: ``search`` (content = query), ``answer`` (content = answer) or ``invalid`` (feedback set)."""

    kind: ActionKind
    content: str = ""
    feedback: str | None = None


def parse_action(text: str, *, max_query_chars: int = 512) -> Action:
    """Parse the first complete ``<search>…</search>`` or ``<answer>…</answer>`` in one turn's generated text.

    Only the turn's new text is passed here, never the prompt or earlier observations. Whitespace inside a query
    is collapsed; an answer is stripped.

    >>> parse_action("<think>hm</think><search> capital of  France </search>")
    Action(kind='search', content='capital of France', feedback=None)
    >>> parse_action("so <answer> Paris </answer>").content
    'Paris'
    >>> parse_action("<search> unclosed").kind
    'invalid'
    """
    found = [
        (m.start(), kind, m.group(1))
        for kind, rx in (("search", _SEARCH_RE), ("answer", _ANSWER_RE))
        if (m := rx.search(text))
    ]
    if not found:
        return Action("invalid", feedback=INVALID_ACTION_FEEDBACK)
    _, kind, inner = min(found)
    if kind == "search":
        query = " ".join(inner.split())
        if not query:
            return Action("invalid", feedback=EMPTY_QUERY_FEEDBACK)
        if len(query) > max_query_chars:
            return Action("invalid", feedback=LONG_QUERY_FEEDBACK)
        return Action("search", query)
    answer = inner.strip()
    if not answer:
        return Action("invalid", feedback=EMPTY_ANSWER_FEEDBACK)
    return Action("answer", answer)
