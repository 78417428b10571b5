"""Action parsing: what the model may do in a turn (search or answer), read from its new text.

The tags and the corrective feedback texts are constants of ``search_rl.tags``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from search_rl.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    EMPTY_ANSWER_FEEDBACK,
    EMPTY_QUERY_FEEDBACK,
    INVALID_ACTION_FEEDBACK,
    LONG_QUERY_FEEDBACK,
    SEARCH_CLOSE,
    SEARCH_OPEN,
)

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


def is_search_attempt(text: str, action: Action) -> bool:
    """Whether a turn tried to search: it is not a valid answer and its text holds the opening ``<search>`` tag.

    Well-formed searches count, and so do unclosed, empty and over-long queries (the parser's ``invalid`` with a
    ``<search>`` in the text). The share of attempts that reached the retriever is ``valid_search_rate``.

    >>> is_search_attempt("<search> q </search>", parse_action("<search> q </search>"))
    True
    >>> is_search_attempt("<search> q", parse_action("<search> q"))
    True
    >>> is_search_attempt("<answer> a </answer><search> q </search>", parse_action("<answer> a </answer>"))
    False
    """
    return action.kind != "answer" and SEARCH_OPEN in text
