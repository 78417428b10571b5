"""Observation formatting and token-budget truncation (passage text is cut, tags never are).

Run: python -m pytest tests/search_rl/rollout/test_observations.py -q
"""

from __future__ import annotations

import pytest

from search_rl.datatypes import Passage
from search_rl.rollout.observations import ObservationBuilder, format_passages, water_fill
from search_rl.tags import OBS_PREFIX, OBS_SUFFIX

PASSAGES = [
    Passage("1", "Paris", "Paris is the capital and most populous city of France. " * 4),
    Passage("2", "Zürich", "Zürich ist die größte Stadt der Schweiz — 日本語のテキストも少し。" * 3),
    Passage("3", "Short", "Tiny."),
]


@pytest.fixture(scope="module")
def builder(tokenizer):
    return ObservationBuilder(tokenizer)


def test_full_observation_is_search_r1_layout(builder, tokenizer):
    obs = builder.passages(PASSAGES, 10_000)
    assert obs.text == format_passages(PASSAGES)
    assert obs.text.startswith("\n\n<information>Doc 1(Title: Paris) Paris is the capital")
    assert "\nDoc 2(Title: Zürich) Zürich ist" in obs.text and "\nDoc 3(Title: Short) Tiny.</information>" in obs.text
    assert obs.text.endswith("</information>\n\n")
    assert (obs.tokens_truncated, obs.passages_dropped) == (0, 0)
    assert tokenizer.decode(list(obs.ids)) == obs.text


@pytest.mark.parametrize("budget", [12, 16, 25, 40, 60, 90, 130, 200])
def test_truncation_respects_budget_and_keeps_tags(builder, tokenizer, budget):
    full = builder.passages(PASSAGES, 10_000)
    obs = builder.passages(PASSAGES, budget)
    assert obs is not None
    assert len(obs.ids) <= budget
    assert obs.text.startswith(OBS_PREFIX) and obs.text.endswith(OBS_SUFFIX)
    assert obs.text.count("</information>") == 1
    assert tokenizer.decode(list(obs.ids)) == obs.text
    assert "\ufffd" not in obs.text, "a multi-byte character was split"
    # every token removed is counted
    if obs.passages_dropped == 0:
        assert len(full.ids) - len(obs.ids) == obs.tokens_truncated
    else:
        assert obs.tokens_truncated > 0 and f"Doc {4 - obs.passages_dropped}(" not in obs.text


def test_short_passages_keep_everything_long_ones_share(builder):
    obs = builder.passages(PASSAGES, 90)
    assert "Doc 3(Title: Short) Tiny." in obs.text  # the short passage is never cut
    assert obs.passages_dropped == 0 and obs.tokens_truncated > 0


def test_budget_below_tags_gives_none(builder):
    assert builder.passages(PASSAGES, builder.min_tokens - 1) is None
    tags_only = builder.passages(PASSAGES, builder.min_tokens)
    assert tags_only.text == OBS_PREFIX + OBS_SUFFIX and tags_only.passages_dropped == 3


def test_no_results_and_plain_text(builder):
    assert builder.passages([], 100).text == format_passages([])
    assert "No results." in builder.passages([], 100).text
    err = builder.text("Search failed: x" * 50, 30)
    assert len(err.ids) <= 30 and err.text.endswith(OBS_SUFFIX) and err.tokens_truncated > 0


def test_feedback_inserted_verbatim_or_not_at_all(builder, tokenizer):
    fb = builder.feedback("\nMy previous action is invalid.\n", 100)
    assert fb.text == "\nMy previous action is invalid.\n" and tokenizer.decode(list(fb.ids)) == fb.text
    assert builder.feedback("\nMy previous action is invalid.\n", 2) is None


def test_water_fill():
    assert water_fill([5, 100, 100], 45) == [5, 20, 20]
    assert water_fill([5, 6], 100) == [5, 6]
    assert water_fill([10, 10], 0) == [0, 0]
    assert sum(water_fill([7, 50, 3, 90], 61)) <= 61
