"""Fixtures of the tool tests: the SmolLM2 tokenizer with Qwen2.5's tool template (``qwen_template.py``), whose
template renders ``tools`` and ``role: tool`` messages where SmolLM2's ignores them."""

from __future__ import annotations

import copy

import pytest
from qwen_template import QWEN25_TEMPLATE


@pytest.fixture(scope="session")
def qwen_tokenizer(tokenizer):
    """A copy of the session's tokenizer with Qwen2.5's chat template (the shared one is left as it is)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN25_TEMPLATE
    return tok
