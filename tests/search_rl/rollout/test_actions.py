"""Action parsing from one turn's generated text.

Run: python -m pytest tests/search_rl/rollout/test_actions.py -q
"""

from __future__ import annotations

import pytest

from search_rl.rollout.actions import Action, parse_action
from search_rl.tags import EMPTY_ANSWER_FEEDBACK, EMPTY_QUERY_FEEDBACK, INVALID_ACTION_FEEDBACK, LONG_QUERY_FEEDBACK


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>need it</think>\n<search>capital of France</search>", Action("search", "capital of France")),
        ("<search>  multi\n line\tquery </search>", Action("search", "multi line query")),
        ("<answer> Paris </answer>", Action("answer", "Paris")),
        # the first complete action wins, whichever kind it is
        ("<answer> A </answer> then <search> q </search>", Action("answer", "A")),
        ("<search> q </search> then <answer> A </answer>", Action("search", "q")),
        # an unclosed tag before a complete one does not hide it
        ("<search> unclosed ... <answer> B </answer>", Action("answer", "B")),
    ],
)
def test_valid_actions(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    ("text", "feedback"),
    [
        ("I think the answer is Paris.", INVALID_ACTION_FEEDBACK),
        ("<search> capital of France", INVALID_ACTION_FEEDBACK),
        ("<answer> Paris", INVALID_ACTION_FEEDBACK),
        ("</search> backwards <search>", INVALID_ACTION_FEEDBACK),
        ("<search>   </search>", EMPTY_QUERY_FEEDBACK),
        ("<answer>\n</answer>", EMPTY_ANSWER_FEEDBACK),
        ("", INVALID_ACTION_FEEDBACK),
    ],
)
def test_invalid_actions_carry_their_feedback(text, feedback):
    action = parse_action(text)
    assert action.kind == "invalid" and action.feedback == feedback


def test_query_length_limit():
    assert parse_action(f"<search>{'x' * 20}</search>", max_query_chars=20).kind == "search"
    long = parse_action(f"<search>{'x' * 21}</search>", max_query_chars=20)
    assert long.kind == "invalid" and long.feedback == LONG_QUERY_FEEDBACK
