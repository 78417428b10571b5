"""Search diagnostics: why a run does or does not learn, read from its trajectories and their gold answers.

Per trajectory, ``diagnose`` says what its searches did and why its answer is right or wrong; ``search_metrics``
turns a batch of them into rates. The definitions, which docs/training.md and docs/troubleshooting.md repeat:

- **search attempt**: a model turn that is not a valid answer and whose text holds the opening ``<search>`` tag
  (``TrajectoryStats.search_attempts``, counted by the agent loop on the text the action parser reads). A
  *valid search* is an attempt that was well formed and sent to the retriever (``TrajectoryStats.searches``);
  unclosed, empty and over-long queries, searches in the final (answer-only) turn and searches that no longer fit
  the response budget are attempts that were not. A retriever failure still counts as sent: it is the
  retriever's fault, counted by ``rollout/retriever_errors``.
- **duplicate query**: a search whose query, normalised as EM normalises answers, equals an earlier query of the
  same trajectory.
- **gold retrieved**: a gold answer, normalised as EM normalises it, occurs as whole words in the title or text of
  a passage the model was shown (after observation truncation: a gold answer cut away was not seen).
- **outcome**: ``correct`` (EM 1), else ``no_answer`` (no ``<answer>``), else ``wrong_no_search`` (answered
  without searching), else ``read_wrong`` (the gold answer was retrieved, the answer is still wrong) or
  ``retrieval_missed`` (searched, but no passage shown held a gold answer).
- **where a read-wrong answer came from** (``answer_source``, only for ``read_wrong``): ``gold_passage`` (the
  answer occurs, as ``gold retrieved`` matches, in a passage shown that also holds a gold answer: the right passage,
  the wrong span), ``other_passage`` (it occurs only in passages without a gold answer) or ``not_shown`` (in no
  passage shown: made up or reworded).
- **answer length**: whitespace-separated words of the extracted answer (the one the reward scored).
- **yes/no question**: every gold answer normalises to yes or no (HotpotQA's comparisons;
  ``reward.qa_em.is_judgement``). Its gold is never "retrieved" as a span in any meaningful sense, so its own
  metrics say whether the policy answered with a judgement at all and how often it was right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from search_rl.datatypes import RewardResult, Trajectory
from search_rl.reward import extract_answer, is_judgement, normalize_answer

Outcome = Literal["correct", "no_answer", "wrong_no_search", "retrieval_missed", "read_wrong"]
WRONG_OUTCOMES: tuple[Outcome, ...] = ("no_answer", "wrong_no_search", "retrieval_missed", "read_wrong")
"""The outcomes of a trajectory whose EM is 0; with ``em`` their shares sum to 1."""
AnswerSource = Literal["gold_passage", "other_passage", "not_shown"]
ANSWER_SOURCES: tuple[AnswerSource, ...] = ("gold_passage", "other_passage", "not_shown")
"""Where a ``read_wrong`` answer came from; their ``read_wrong_<source>`` shares sum to ``read_wrong``."""
ANSWER_SOURCE_LABELS: dict[AnswerSource, str] = {
    "gold_passage": "the gold's passage",
    "other_passage": "another passage",
    "not_shown": "no passage",
}
"""Column headers of the ``ANSWER_SOURCES`` in the tables that print them."""
SEARCH_BUCKETS: tuple[str, ...] = ("0", "1", "2", "3plus")
"""Buckets of ``em_searches_<bucket>`` / ``n_searches_<bucket>``: 0, 1, 2, and 3 or more searches."""


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """Whether any non-empty gold answer occurs in ``text`` as whole words, both normalised as EM normalises.

    >>> contains_answer("Paris is the capital of France.", ["The Paris"])
    True
    >>> contains_answer("Parisian cafés", ["Paris"])
    False
    """
    haystack = f" {normalize_answer(text)} "
    return any((g := normalize_answer(gold)) and f" {g} " in haystack for gold in golds)


def duplicate_queries(queries: Sequence[str]) -> int:
    """How many queries repeat an earlier one of the sequence after normalisation.

    >>> duplicate_queries(["capital of France", "The capital of france?", "Lyon", "capital of France"])
    2
    """
    seen: set[str] = set()
    duplicates = 0
    for query in queries:
        key = normalize_answer(query)
        duplicates += key in seen
        seen.add(key)
    return duplicates


def search_bucket(searches: int) -> str:
    """The ``SEARCH_BUCKETS`` entry of a search count.

    >>> [search_bucket(n) for n in (0, 1, 2, 3, 7)]
    ['0', '1', '2', '3plus', '3plus']
    """
    return SEARCH_BUCKETS[min(searches, len(SEARCH_BUCKETS) - 1)]


@dataclass(frozen=True)
class SearchDiagnosis:
    """What one trajectory's searches did and why its answer is right or wrong (definitions in the module doc)."""

    attempts: int
    searches: int
    duplicates: int
    gold_retrieved: bool
    outcome: Outcome
    answer_words: int | None
    em: float
    yes_no_question: bool = False
    yes_no_answer: bool = False
    answer_source: AnswerSource | None = None


def answer_source(answer: str, passages: Sequence[str], golds: Sequence[str]) -> AnswerSource:
    """Where a wrong ``answer`` came from among the ``passages`` shown (title and text each).

    >>> shown = ["Paris and Lyon are French cities.", "Berlin is in Germany."]
    >>> [answer_source(a, shown, ["Paris"]) for a in ("Lyon", "Berlin", "Madrid")]
    ['gold_passage', 'other_passage', 'not_shown']
    """
    holding = [contains_answer(p, [answer]) for p in passages]
    if any(h and contains_answer(p, golds) for h, p in zip(holding, passages, strict=True)):
        return "gold_passage"
    return "other_passage" if any(holding) else "not_shown"


def diagnose(trajectory: Trajectory, golds: Sequence[str], result: RewardResult) -> SearchDiagnosis:
    """Diagnose one scored trajectory against its gold answers (``result.components["em"]`` is its EM)."""
    answer = extract_answer(trajectory.model_texts)
    em = result.components.get("em", 0.0)
    shown = [f"{p.title} {p.text}" for call in trajectory.search_calls for p in call.passages]
    gold_retrieved = any(contains_answer(p, golds) for p in shown)
    outcome: Outcome
    if em > 0:
        outcome = "correct"
    elif answer is None:
        outcome = "no_answer"
    elif trajectory.num_searches == 0:
        outcome = "wrong_no_search"
    else:
        outcome = "read_wrong" if gold_retrieved else "retrieval_missed"
    return SearchDiagnosis(
        attempts=trajectory.stats.search_attempts,
        searches=trajectory.num_searches,
        duplicates=duplicate_queries([c.query for c in trajectory.search_calls if c.tool == "search"]),
        gold_retrieved=gold_retrieved,
        outcome=outcome,
        answer_words=None if answer is None else len(answer.split()),
        em=em,
        yes_no_question=yes_no_question(golds),
        yes_no_answer=answer is not None and is_judgement(answer),
        answer_source=answer_source(answer, shown, golds) if outcome == "read_wrong" and answer is not None else None,
    )


def yes_no_question(golds: Sequence[str]) -> bool:
    """Whether every non-empty gold answer is yes or no (and there is one).

    >>> yes_no_question(["Yes"]), yes_no_question(["no", ""]), yes_no_question(["no", "Paris"]), yes_no_question([])
    (True, True, False, False)
    """
    kept = [g for g in golds if normalize_answer(g)]
    return bool(kept) and all(is_judgement(g) for g in kept)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(diagnoses: Sequence[SearchDiagnosis], prefix: str) -> dict[str, float]:
    """The batch's rates under ``<prefix>/``.

    Keys: ``search_attempts`` (mean per trajectory), ``valid_search_rate`` (searches sent / attempts; 0 without
    attempts), ``duplicate_query_rate`` (duplicates / searches sent; 0 without searches), ``gold_retrieved`` (share
    of trajectories), the shares of ``WRONG_OUTCOMES`` (over all trajectories) and of ``read_wrong_<source>`` per
    ``ANSWER_SOURCES`` entry (over all trajectories, summing to ``read_wrong``), ``n_searches_<b>`` (count per
    ``SEARCH_BUCKETS`` entry) and ``em_searches_<b>`` (mean EM of that bucket, only when it is not empty),
    ``answer_words_mean`` (over trajectories with an answer; 0 without any), ``n_yes_no`` (yes/no questions) and,
    when there are any, ``em_yes_no`` (their mean EM) and ``yes_no_answered`` (the share answered yes or no).
    """
    attempts = sum(d.attempts for d in diagnoses)
    searches = sum(d.searches for d in diagnoses)
    answered = [float(d.answer_words) for d in diagnoses if d.answer_words is not None]
    metrics = {
        f"{prefix}/search_attempts": _mean([float(d.attempts) for d in diagnoses]),
        f"{prefix}/valid_search_rate": searches / attempts if attempts else 0.0,
        f"{prefix}/duplicate_query_rate": sum(d.duplicates for d in diagnoses) / searches if searches else 0.0,
        f"{prefix}/gold_retrieved": _mean([float(d.gold_retrieved) for d in diagnoses]),
        f"{prefix}/answer_words_mean": _mean(answered),
    }
    for outcome in WRONG_OUTCOMES:
        metrics[f"{prefix}/{outcome}"] = _mean([float(d.outcome == outcome) for d in diagnoses])
    for source in ANSWER_SOURCES:
        metrics[f"{prefix}/read_wrong_{source}"] = _mean([float(d.answer_source == source) for d in diagnoses])
    for bucket in SEARCH_BUCKETS:
        ems = [d.em for d in diagnoses if search_bucket(d.searches) == bucket]
        metrics[f"{prefix}/n_searches_{bucket}"] = float(len(ems))
        if ems:
            metrics[f"{prefix}/em_searches_{bucket}"] = _mean(ems)
    yes_no = [d for d in diagnoses if d.yes_no_question]
    metrics[f"{prefix}/n_yes_no"] = float(len(yes_no))
    if yes_no:
        metrics[f"{prefix}/em_yes_no"] = _mean([d.em for d in yes_no])
        metrics[f"{prefix}/yes_no_answered"] = _mean([float(d.yes_no_answer) for d in yes_no])
    return metrics


def search_metrics(
    trajectories: Sequence[Trajectory],
    results: Sequence[RewardResult],
    targets: Sequence[Sequence[str]],
    prefix: str,
) -> dict[str, float]:
    """``summarize`` of the batch's diagnoses (one trajectory, result and gold-answer list per sample)."""
    diagnoses = [diagnose(t, g, r) for t, r, g in zip(trajectories, results, targets, strict=True)]
    return summarize(diagnoses, prefix)
