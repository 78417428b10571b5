"""Prompt encoding: chat messages (the parquet ``prompt`` column) to the token ids a rollout starts from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Apply the tokenizer's chat template with the assistant generation prompt; plain text if it has none.

    The rollout appends the model's tokens right after these ids, so the template must end where the assistant's
    turn begins (``add_generation_prompt=True``).
    """
    msgs = [dict(m) for m in messages]
    if getattr(tokenizer, "chat_template", None):
        out: Any = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers v5 returns a BatchEncoding
        return [int(i) for i in ids]
    text = "\n".join(m["content"] for m in msgs) + "\n"
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
