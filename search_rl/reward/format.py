"""Format check of the tag protocol on the model-generated segments only (so any chat template works).

A well-formed episode: every model turn but the last has exactly one ``<search>…</search>`` and has no answer;
the last turn has exactly one ``<answer>…</answer>`` and no search; no turn writes ``<information>`` tags
(those are the environment's); ``<think>`` tags, where used, are balanced within each turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from search_rl.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)


def _one_action(text: str, opening: str, closing: str, other: str) -> bool:
    """Exactly one ``opening…closing`` pair, in that order, and no ``other`` action tag."""
    return (
        text.count(opening) == 1
        and text.count(closing) == 1
        and text.find(opening) < text.find(closing)
        and other not in text
    )


def format_ok(model_texts: Sequence[str]) -> bool:
    """Whether the model's turns follow the protocol (see module docstring).

    >>> format_ok(["<think>need x</think><search> x </search>", "<think>ok</think><answer> y </answer>"])
    True
    >>> format_ok(["<answer> y </answer>", "<answer> z </answer>"])
    False
    >>> format_ok(["<information>fake</information><answer> y </answer>"])
    False
    """
    if not model_texts:
        return False
    for i, text in enumerate(model_texts):
        if INFO_OPEN in text or INFO_CLOSE in text:
            return False
        if text.count(THINK_OPEN) != text.count(THINK_CLOSE):
            return False
        last = i == len(model_texts) - 1
        if last and not _one_action(text, ANSWER_OPEN, ANSWER_CLOSE, SEARCH_OPEN):
            return False
        if not last and not _one_action(text, SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN):
            return False
    return True
