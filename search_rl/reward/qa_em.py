"""QA answer scoring: SQuAD-style normalisation, exact match, substring exact match, token F1, answer extraction.

The answer is the content of the last ``<answer>…</answer>`` in the *model-generated* segments only, so an answer
that appears in the prompt (the template's example) or inside a retrieved passage never counts.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from search_rl.tags import ANSWER_CLOSE, ANSWER_OPEN

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_ANSWER_RE = re.compile(f"{re.escape(ANSWER_OPEN)}(.*?){re.escape(ANSWER_CLOSE)}", re.DOTALL)


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


JUDGEMENT_ANSWERS = frozenset({"yes", "no"})
"""Answers judged from passages rather than copied from them (HotpotQA's comparison questions): no text holds them
as a span, and a text holding the word "no" does not say the answer is no."""


def is_judgement(answer: str) -> bool:
    """Whether ``answer`` normalises to yes or no.

    >>> is_judgement("Yes."), is_judgement("no"), is_judgement("Noah")
    (True, True, False)
    """
    return normalize_answer(answer) in JUDGEMENT_ANSWERS


def normalize_answer(text: str) -> str:
    """SQuAD normalisation, made Unicode-aware: NFKC, lower-case, drop punctuation (ASCII and Unicode ``P*``),
    drop the articles a/an/the, collapse whitespace. Accents are kept (``é`` stays ``é``).

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    >>> normalize_answer("“São Paulo”")
    'são paulo'
    >>> normalize_answer("ＡＢＣ")
    'abc'
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if not _is_punct(ch))  # deleted, not spaced: "U.S." == "US" as in SQuAD
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0 (None scores 0).

    >>> exact_match("the Beatles", ["Beatles", "The Fab Four"])
    1.0
    >>> exact_match("Beatles band", ["Beatles"])
    0.0
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def sub_exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if any (non-empty) normalised gold answer is a substring of the normalised prediction, else 0.0.

    Plain substring, as in Search-R1 and FlashRAG, so figures compare with theirs ("Parisian" contains "paris").

    >>> sub_exact_match("it was the Beatles in 1962", ["beatles"])
    1.0
    >>> sub_exact_match("Lyon", ["Paris"])
    0.0
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any((g := normalize_answer(gold)) and g in pred for gold in _golds(golds)))


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Best token-level F1 between the normalised prediction and any gold answer.

    >>> f1_score("Barack Obama", ["Obama"])
    0.6666666666666666
    """
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in _golds(golds):
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def extract_answer(model_texts: Sequence[str]) -> str | None:
    """Content of the last ``<answer>…</answer>`` across the model-generated segments, stripped; None if absent.

    Each segment is searched on its own, so tags split across an inserted observation never pair up.

    >>> extract_answer(["<search> q </search>", "<answer> Paris </answer>"])
    'Paris'
    >>> extract_answer(["no tags here"]) is None
    True
    """
    last: str | None = None
    for text in model_texts:
        found = _ANSWER_RE.findall(text)
        if found:
            last = found[-1].strip()
    return last
