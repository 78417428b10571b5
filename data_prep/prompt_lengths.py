"""Prompt-length statistics in tokens, measured the way the trainer will tokenize the prompts.

If the tokenizer has a chat template, each prompt is rendered with it (``add_generation_prompt=True``), as
Search-R1 does for instruct models; otherwise the message contents joined by newlines, plus a final newline, are
encoded without special tokens. Both mirror ``search_rl.prompt_data.encode_prompt``, which the rollout uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PromptLengthStats:
    """Token counts of a set of prompts."""

    count: int
    min: int
    mean: float
    p50: int
    p95: int
    max: int
    over_limit: int | None
    """How many prompts are longer than ``max_prompt_length`` (None when no limit was given)."""
    max_prompt_length: int | None
    used_chat_template: bool

    def describe(self) -> str:
        text = (
            f"prompt tokens over {self.count} rows ({'chat template' if self.used_chat_template else 'raw text'}): "
            f"min={self.min} mean={self.mean:.1f} p50={self.p50} p95={self.p95} max={self.max}"
        )
        if self.max_prompt_length is not None:
            text += f"; {self.over_limit} rows exceed max_prompt_length={self.max_prompt_length}"
        return text


def load_tokenizer(name_or_path: str) -> Any:
    """Load a Hugging Face tokenizer from a local folder, a hub name, or a ``.gguf`` file."""
    from transformers import AutoTokenizer  # heavy import, only when a report is asked for

    path = Path(name_or_path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name_or_path)


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def count_prompt_tokens(messages: Sequence[Sequence[dict[str, str]]], tokenizer: Any) -> tuple[list[int], bool]:
    """Token count of each chat prompt, and whether the tokenizer's chat template was used."""
    use_chat = bool(getattr(tokenizer, "chat_template", None))
    lengths = []
    for prompt in messages:
        if use_chat:
            ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            # transformers 5 returns a BatchEncoding here; older versions a plain list of ids.
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            text = "\n".join(m["content"] for m in prompt) + "\n"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
    return lengths, use_chat


def prompt_length_stats(
    messages: Sequence[Sequence[dict[str, str]]], tokenizer: Any, max_prompt_length: int | None = None
) -> PromptLengthStats:
    """Measure prompt lengths in tokens and count those over ``max_prompt_length``.

    Raises:
        ValueError: ``messages`` is empty.
    """
    if not messages:
        raise ValueError("no prompts to measure")
    lengths, used_chat = count_prompt_tokens(messages, tokenizer)
    ordered = sorted(lengths)
    over = None if max_prompt_length is None else sum(n > max_prompt_length for n in lengths)
    return PromptLengthStats(
        count=len(lengths),
        min=ordered[0],
        mean=sum(lengths) / len(lengths),
        p50=_percentile(ordered, 50),
        p95=_percentile(ordered, 95),
        max=ordered[-1],
        over_limit=over,
        max_prompt_length=max_prompt_length,
        used_chat_template=used_chat,
    )
