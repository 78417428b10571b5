"""Prompt templates under configs/templates/: the shipped ones load and say the protocol, slots fill exactly once,
and misuse raises a clear error.

Run: python -m pytest tests/search_rl/test_templates.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from search_rl.templates import available_templates, format_passages, load_template, render_prompt

TAGS = ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>")


def test_shipped_templates() -> None:
    assert available_templates() == ["naive_rag", "no_search", "search", "tool_call"]
    search = load_template("search")
    assert all(tag in search.text for tag in TAGS) and not search.needs_passages
    no_search = load_template("no_search")
    assert "<search>" not in no_search.text and "<answer>" in no_search.text and not no_search.needs_passages
    assert load_template("naive_rag").needs_passages
    tool_call = load_template("tool_call")  # the chat-template format: the tools are listed by the template itself
    assert "<answer>" in tool_call.text and "<search>" not in tool_call.text and not tool_call.needs_passages
    for name in available_templates():
        text = load_template(name).text
        assert text.count("{question}") == 1 and text.endswith("Question: {question}\n")


def test_render_search_prompt() -> None:
    prompt = render_prompt(load_template("search"), "who wrote hamlet?")
    assert prompt.endswith("\nQuestion: who wrote hamlet?\n") and "{" not in prompt


def test_render_naive_rag_with_passages() -> None:
    passages = ['"Hamlet"\nHamlet is a tragedy by William Shakespeare.', '"Macbeth"\nMacbeth is a tragedy.']
    prompt = render_prompt(load_template("naive_rag"), "who wrote hamlet?", passages)
    assert (
        "Passages:\nDoc 1(Title: Hamlet) Hamlet is a tragedy by William Shakespeare.\n"
        "Doc 2(Title: Macbeth) Macbeth is a tragedy.\nQuestion: who wrote hamlet?\n"
    ) in prompt


def test_slots_are_filled_in_one_pass() -> None:
    # A question or passage that contains a slot name is inserted literally, not expanded again.
    prompt = render_prompt(load_template("naive_rag"), "what is {passages}?", ['"T"\nabout {question}'])
    assert "Doc 1(Title: T) about {question}\nQuestion: what is {passages}?\n" in prompt


def test_format_passages_without_title_line() -> None:
    assert format_passages(["just text"]) == "Doc 1(Title: just text) "


def test_template_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "paper.txt"
    path.write_text("Q: {question} {not_a_slot}\nA:", encoding="utf-8")
    template = load_template(str(path))
    assert template.name == "paper"
    assert render_prompt(template, "why?") == "Q: why? {not_a_slot}\nA:"


def test_template_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found.*'search'"):
        load_template("serach")
    bad = tmp_path / "bad.txt"
    bad.write_text("no slot here", encoding="utf-8")
    with pytest.raises(ValueError, match=r"has no \{question\} slot"):
        load_template(str(bad))
    with pytest.raises(ValueError, match="pass the retrieved passages"):
        render_prompt(load_template("naive_rag"), "q?")
    with pytest.raises(ValueError, match="no \\{passages\\} slot but passages were given"):
        render_prompt(load_template("search"), "q?", ["p"])
