"""Prompt templates: text files under ``configs/templates/`` with a ``{question}`` slot (and maybe ``{passages}``).

A template is used verbatim, final newline included; only the exact strings ``{question}`` and ``{passages}``
are replaced, so other braces in a template need no escaping. Shipped templates:

- ``search``: the search protocol (``<think>``, ``<search>``, ``<information>``, ``<answer>``); the training default.
- ``no_search``: answer directly, for the no-retrieval baseline.
- ``tool_call``: for ``rollout.action_format=chat_template``: call the tools the chat template lists, answer in
  ``<answer>`` (no tags of its own for the calls: the model's template gives their format).
- ``naive_rag``: top-k passages inlined through ``{passages}``, for the retrieve-once baseline. Its passages are
  only known at evaluation time, so ``qa_to_parquet`` refuses it; the rows keep the bare ``question`` for that.

A leaf module (the standard library and the protocol's text layout): ``data_prep`` renders the rows' prompts with it
and ``main_eval`` the baselines' prompts.

To reproduce another paper's prompt exactly, write it to a file with a ``{question}`` slot and pass its path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from retriever_server.passages import split_contents
from search_rl.tags import format_docs

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "configs" / "templates"
QUESTION_SLOT = "{question}"
PASSAGES_SLOT = "{passages}"
_SLOTS = re.compile(re.escape(QUESTION_SLOT) + "|" + re.escape(PASSAGES_SLOT))


class Doc(Protocol):
    """A retrieved passage with a title (``search_rl.datatypes.Passage`` is one)."""

    @property
    def title(self) -> str: ...

    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class Template:
    """A loaded prompt template."""

    name: str
    path: Path
    text: str

    @property
    def needs_passages(self) -> bool:
        return PASSAGES_SLOT in self.text


def available_templates() -> list[str]:
    """Names of the templates shipped under ``configs/templates/``."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.txt"))


def load_template(name_or_path: str) -> Template:
    """Load a shipped template by name (``search``) or any template file by path.

    Raises:
        ValueError: the template does not exist or has no ``{question}`` slot.
    """
    path = Path(name_or_path)
    if not path.is_file():
        path = TEMPLATE_DIR / f"{name_or_path}.txt"
    if not path.is_file():
        raise ValueError(
            f"template {name_or_path!r} not found: it is neither a file nor one of the shipped "
            f"templates {available_templates()} in {TEMPLATE_DIR}"
        )
    text = path.read_text(encoding="utf-8")
    if QUESTION_SLOT not in text:
        raise ValueError(f"template {path} has no {QUESTION_SLOT} slot; add one where the question goes")
    return Template(name=path.stem, path=path, text=text)


def format_passages(passages: Sequence[str | Doc]) -> str:
    """Number retrieved passages for the ``{passages}`` slot, one per line.

    Each passage is a ``Passage`` (any object with ``title`` and ``text``) or a corpus ``contents`` string,
    ``"Title"\\ntext``. The layout is the one search observations use (``search_rl.tags.format_docs``, after
    Search-R1), so the baseline shows passages exactly as the search policy sees them.

    >>> format_passages(['"Paris"\\nParis is the capital of France.'])
    'Doc 1(Title: Paris) Paris is the capital of France.'
    """
    return format_docs(split_contents(p) if isinstance(p, str) else (p.title, p.text) for p in passages)


def render_prompt(template: Template, question: str, passages: Sequence[str | Doc] | None = None) -> str:
    """Fill the template's slots.

    Raises:
        ValueError: passages are missing for a template that has a ``{passages}`` slot, or given for one without.
    """
    if template.needs_passages and passages is None:
        raise ValueError(f"template {template.path} has a {PASSAGES_SLOT} slot: pass the retrieved passages")
    if passages is not None and not template.needs_passages:
        raise ValueError(f"template {template.path} has no {PASSAGES_SLOT} slot but passages were given")
    values = {QUESTION_SLOT: question, PASSAGES_SLOT: format_passages(passages) if passages is not None else ""}
    # One pass, so a question or passage that happens to contain "{passages}" or "{question}" is left alone.
    return _SLOTS.sub(lambda m: values[m.group(0)], template.text)
