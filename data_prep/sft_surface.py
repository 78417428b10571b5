"""The surface of synthetic warm-start trajectories: query forms, the support rule, thoughts, turn text, checks.

Pure functions used by :mod:`data_prep.synth_sft`, which owns the retrieval rounds and the files. A turn is
``{"text": what the model writes, "passages": what the retriever returned for the turn's query}``; the trainer
formats the passages into the ``<information>`` block with the rollout's own ``ObservationBuilder``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from search_rl.datatypes import Passage
from search_rl.reward.format import format_ok
from search_rl.reward.qa_em import JUDGEMENT_ANSWERS, normalize_answer
from search_rl.rollout.actions import parse_action
from search_rl.tags import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, THINK_CLOSE, THINK_OPEN

MAX_THOUGHT_WORDS = 24
MAX_ENTITIES = 6
UNSUPPORTABLE = JUDGEMENT_ANSWERS
"""Golds that a passage cannot support by containing them (the word "no" in a text does not say the answer is no)."""

BEFORE_SEARCH = (
    'Let me search for "{query}".',
    'I need to look this up. I will search for "{query}".',
    "I do not know this for sure, so I will search for it.",
    "I should check Wikipedia before answering.",
    "Let me find a passage about this first.",
)
AFTER_MISS = (
    "The passages do not mention it. Let me search again.",
    "None of these documents gives the answer. I will try other words.",
    "I did not find the answer yet. Let me rephrase the search.",
)
AFTER_MISS_ENTITY = (
    "Doc {doc} mentions {entity}. Let me search for it.",
    "The answer is not here yet, but Doc {doc} points to {entity}. I will look it up.",
    "I need to know more about {entity}, mentioned in Doc {doc}.",
)
BEFORE_ANSWER = (
    "Doc {doc} says it is {answer}.",
    "The passages say {answer}.",
    "According to Doc {doc} ({title}), the answer is {answer}.",
    "I found it in Doc {doc}: {answer}.",
    "Doc {doc} answers the question.",
)
"""Thought templates; the last of each tuple is the fallback when the others render too long."""

_LEAD = re.compile(
    r"^(?:(?:in|on|at|for|from|by|of|to|with)\s+)?(?:who|whom|whose|what|when|where|which|why|"
    r"how(?:\s+(?:many|much|long|old|far|big|tall))?)(?:\s+(?:is|are|was|were|did|do|does|has|have|had|will|can|"
    r"could|would|should))?\s+|^(?:is|are|was|were|did|do|does|has|have|had|can|could)\s+",
    re.IGNORECASE,
)
_ENTITY = re.compile(r"[A-Z][\w'&-]*(?:\s+(?:(?:of|the|de|du|von|van|der|and|la|le|del|da|di)\s+)*[A-Z0-9][\w'&-]*)*")
_SENTENCE_START = re.compile(r"(?:^|[.!?]\s+)$")


def question_query(question: str) -> str:
    """The question as a query: whitespace collapsed, trailing ``?`` dropped.

    >>> question_query("Who wrote Hamlet?")
    'Who wrote Hamlet'
    """
    return " ".join(question.split()).rstrip("?").strip()


def rewrite_query(question: str) -> str:
    """Keyword rewrite: a leading wh-word/auxiliary dropped, lower-cased, trailing punctuation dropped.

    >>> rewrite_query("When did the Berlin Wall fall?")
    'the berlin wall fall'
    >>> rewrite_query("In what city was Corelli born?")
    'city was corelli born'
    """
    plain = " ".join(question.split()).rstrip("?.! ")
    rest = _LEAD.sub("", plain, count=1)
    return (rest if len(rest.split()) >= 2 else plain).lower()


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether normalised ``phrase`` occurs in normalised ``text`` on word boundaries (empty never does).

    >>> contains_phrase("Paris is in France.", "paris"), contains_phrase("A Parisian cafe", "Paris")
    (True, False)
    """
    needle = normalize_answer(phrase)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


def has_gold(query: str, golds: Sequence[str]) -> bool:
    """Whether a query contains one of ``golds`` (such a query would hand the model its answer)."""
    return any(contains_phrase(query, g) for g in golds)


@dataclass(frozen=True)
class Support:
    """The gold answer used and where it was found (``doc`` is 1-based, as in the ``Doc i`` observation)."""

    answer: str
    passage: Passage
    doc: int


def find_support(passages: Sequence[Passage], golds: Sequence[str]) -> Support | None:
    """The first gold (in target order) found in some passage's title + text, with the first such passage.

    >>> find_support([Passage("7", "France", "Its capital is Paris.")], ["no", "Paris"]).doc
    1
    """
    for gold in golds:
        if normalize_answer(gold) in UNSUPPORTABLE:
            continue
        for i, p in enumerate(passages):
            if contains_phrase(f"{p.title} {p.text}", gold):
                return Support(gold, p, i + 1)
    return None


@dataclass(frozen=True)
class Search:
    """One search turn: how its query was made (``kind``), the query, what prompted a follow-up, the hits."""

    kind: str
    query: str
    entity: str = ""
    doc: int = 0
    passages: tuple[Passage, ...] = ()


def passage_entities(question: str, passages: Sequence[Passage]) -> list[tuple[str, int]]:
    """Names in the passages' text (capitalised runs) that add a word to the question and are not a retrieved title,
    with the 1-based doc that names them: the candidates of a multi-hop follow-up search.

    >>> passage_entities("who starred in Foo?", [Passage("1", "Foo", "Foo is a film. It stars Helen Hunt.")])
    [('Helen Hunt', 1)]
    """
    known = set(normalize_answer(question).split())
    titles = {normalize_answer(p.title) for p in passages}
    out: dict[str, tuple[str, int]] = {}
    for doc, p in enumerate(passages, start=1):
        for m in _ENTITY.finditer(p.text):
            name = re.sub(r"^(?:The|A|An)\s+", "", m.group(0)).strip(" '-")
            key = normalize_answer(name)
            lone_starter = " " not in name and _SENTENCE_START.search(p.text[: m.start()])
            if len(key) < 3 or lone_starter or set(key.split()) <= known or key in titles or key in out:
                continue
            out[key] = (name, doc)
    return list(out.values())[:MAX_ENTITIES]


def _thought(rng: random.Random, templates: Sequence[str], **slots: object) -> str:
    """A random template that renders to at most ``MAX_THOUGHT_WORDS`` words (else the last one)."""
    fitting = [t.format(**slots) for t in templates if len(t.format(**slots).split()) <= MAX_THOUGHT_WORDS]
    return rng.choice(fitting or [templates[-1].format(**slots)])


def _turn(thought: str | None, action: str, passages: Sequence[Passage] = ()) -> dict[str, Any]:
    text = f"{THINK_OPEN}{thought}{THINK_CLOSE}\n{action}" if thought is not None else action
    return {"text": text, "passages": [{"id": p.id, "title": p.title, "text": p.text} for p in passages]}


def render_turns(searches: Sequence[Search], support: Support, think: bool, rng: random.Random) -> list[dict[str, Any]]:
    """The trajectory's turns: one per search (with its passages), then the answer turn (no passages)."""
    turns = []
    for i, s in enumerate(searches):
        if i == 0:
            thought = _thought(rng, BEFORE_SEARCH, query=s.query)
        elif s.entity:
            thought = _thought(rng, AFTER_MISS_ENTITY, entity=s.entity, doc=s.doc)
        else:
            thought = _thought(rng, AFTER_MISS)
        turns.append(_turn(thought if think else None, f"{SEARCH_OPEN} {s.query} {SEARCH_CLOSE}", s.passages))
    thought = _thought(rng, BEFORE_ANSWER, doc=support.doc, title=support.passage.title, answer=support.answer)
    turns.append(_turn(thought if think else None, f"{ANSWER_OPEN} {support.answer} {ANSWER_CLOSE}"))
    return turns


def check_turns(
    row_id: str,
    turns: Sequence[dict[str, Any]],
    searches: Sequence[Search],
    support: Support,
    targets: Sequence[str],
    max_searches: int,
) -> None:
    """Invariants of a synthesised trajectory; a failure is a bug in this package, and the message names the row.

    Raises:
        AssertionError: the turns break the protocol, do not parse as the intended searches and answer, a query
            holds the answer, or the answer is not a gold found in one of the trajectory's passages.
    """
    problems, texts = [], [t["text"] for t in turns]
    if not format_ok(texts):
        problems.append(f"format_ok is false for {texts}")
    if not 1 <= len(searches) == len(turns) - 1 <= max_searches or turns[-1]["passages"]:
        problems.append(f"{len(turns)} turns for {len(searches)} searches (max {max_searches})")
    for turn, s in zip(turns, searches, strict=False):
        action = parse_action(turn["text"])
        if (action.kind, action.content) != ("search", s.query) or has_gold(s.query, [support.answer]):
            problems.append(f"search turn parses as {action}, not {s.query!r}, or the query holds the answer")
    action = parse_action(texts[-1])
    if (action.kind, action.content) != ("answer", support.answer) or support.answer not in targets:
        problems.append(f"answer turn parses as {action}, not the gold {support.answer!r}")
    if not any(
        p["id"] == support.passage.id and contains_phrase(f"{p['title']} {p['text']}", support.answer)
        for t in turns
        for p in t["passages"]
    ):
        problems.append(f"answer {support.answer!r} is not in passage {support.passage.id} of the trajectory")
    if problems:
        raise AssertionError(f"row {row_id}: " + "; ".join(problems))
