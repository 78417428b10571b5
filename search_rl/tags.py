"""The text protocol between the model and the search environment: tags, feedback texts, the passage layout.

A leaf module (standard library only): the rollout, the rewards, the prompt templates and ``data_prep`` all read
these constants from here, and nothing else in the code spells them out.
"""

from __future__ import annotations

from collections.abc import Iterable

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
"""Around a tool call's JSON in Hermes-style chat templates (Qwen2.5, Qwen3): ``{"name": ..., "arguments": {...}}``."""

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

OBS_PREFIX = f"\n\n{INFO_OPEN}"
"""Text before the body of an observation."""
OBS_SUFFIX = f"{INFO_CLOSE}\n\n"
"""Text after the body of an observation."""
DOC_SEPARATOR = "\n"
"""Between two passages of an observation (and of a ``{passages}`` template slot)."""
RETRIEVER_ERROR_TEXT = "Search failed: the search engine is unavailable. Answer with what I already know."
"""Body of the observation shown when the retriever fails and ``rollout.on_retriever_error=observe``."""
NO_RESULTS_TEXT = "No results."
"""Body of the observation when the retriever returns no passage for a query."""


def doc_header(index: int, title: str, doc_id: str | None = None) -> str:
    """``Doc {index}(Title: {title})`` — the text before a passage (1-based index); with ``doc_id`` (when the
    ``open`` tool is on) ``Doc {index}(Title: {title}; id: {doc_id})``.

    >>> doc_header(1, "Paris"), doc_header(2, "Lyon", "17")
    ('Doc 1(Title: Paris)', 'Doc 2(Title: Lyon; id: 17)')
    """
    return f"Doc {index}(Title: {title})" if doc_id is None else f"Doc {index}(Title: {title}; id: {doc_id})"


def format_docs(docs: Iterable[tuple[str, str]]) -> str:
    """``(title, text)`` passages in Search-R1's layout: ``Doc i(Title: T) text``, one per line, untruncated.

    >>> format_docs([("Paris", "Paris is the capital of France."), ("Lyon", "A city.")])
    'Doc 1(Title: Paris) Paris is the capital of France.\\nDoc 2(Title: Lyon) A city.'
    """
    return DOC_SEPARATOR.join(f"{doc_header(i, title)} {text}" for i, (title, text) in enumerate(docs, start=1))
