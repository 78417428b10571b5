"""Search diagnostics on hand-built trajectories: every metric against values worked out by hand.

Six trajectories, scored by the real ``qa_em`` reward, cover every outcome:

- A (nq, gold Paris): 1 attempt, 1 search, "Paris is the capital ..." shown, answers Paris: correct.
- B (nq, gold Paris / City of Paris): 2 searches, the second a duplicate ("Capital of france?"), "... the city of
  Paris" shown, answers Lyon: read wrong.
- C (nq, gold Paris): 1 search, only "Parisian cafés" shown (no whole-word match), answers "Marseille port town":
  retrieval missed.
- D (hotpotqa, gold Nice): an unclosed ``<search>`` (1 attempt, 0 searches), answers Lyon: wrong, no search.
- E (hotpotqa, gold Nice): 4 attempts, 3 searches ("a", "b", "A": 1 duplicate; "a" failed), "Nice is in France"
  shown, no answer: no answer.
- F (hotpotqa, gold Paris): no search, answers Paris: correct.

Run: python -m pytest tests/search_rl/reward/test_search_stats.py -q
"""

from __future__ import annotations

import doctest
import json

import pytest
import torch

import search_rl.reward.search_stats as search_stats_module
import search_rl.rollout.actions as actions_module
from search_rl.batches import PromptBatch
from search_rl.config import RewardConfig
from search_rl.datatypes import Passage, SearchCall, Segment, Trajectory, TrajectoryStats
from search_rl.reward import extract_answer
from search_rl.reward.scoring import answer_metrics, score_trajectories
from search_rl.reward.search_stats import contains_answer, diagnose, duplicate_queries, search_metrics
from search_rl.tools import diagnose as diagnose_tool
from search_rl.tracking import build_tracker


def _traj(texts: list[str], calls: tuple[SearchCall, ...], attempts: int) -> Trajectory:
    """A trajectory of model turns ``texts`` with the given searches; ids are placeholders (diagnostics read text)."""
    segments, kinds = [], []
    for text in texts:
        segments.append(Segment("model", len(kinds), len(kinds) + 1, text))
        kinds.append(1)
    stats = TrajectoryStats(turns=len(texts), searches=len(calls), search_attempts=attempts)
    mask = torch.tensor(kinds)
    ids = torch.zeros(len(kinds), dtype=torch.long)
    answer = extract_answer(texts)  # what the agent loop would have parsed
    stop = "answer" if answer is not None else "max_turns"
    return Trajectory(torch.tensor([1]), ids, mask, None, tuple(segments), answer, stop, stats, calls)


def _p(text: str, title: str = "T") -> Passage:
    return Passage("id-" + text[:6], title, text)


def hand_batch() -> tuple[list[Trajectory], PromptBatch]:
    """The six trajectories of the module docstring and their prompts."""
    france = SearchCall("capital of France", (_p("Paris is the capital of France."),))
    trajs = [
        _traj(["<search> capital of France </search>", "<answer> Paris </answer>"], (france,), attempts=1),
        _traj(
            ["<search> capital of France </search>", "<search> Capital of france? </search>", "<answer>Lyon</answer>"],
            (
                SearchCall("capital of France", (_p("Lyon is a city."),)),
                SearchCall("Capital of france?", (_p("France's capital is the city of Paris.", "Capitals"),)),
            ),
            attempts=2,
        ),
        _traj(
            ["<search> french capital </search>", "<answer> Marseille port town </answer>"],
            (SearchCall("french capital", (_p("Parisian cafés are famous.", "Parisian"),)),),
            attempts=1,
        ),
        _traj(["<search> where is Nice", "<answer> Lyon </answer>"], (), attempts=1),
        _traj(
            ["<search> a </search>", "<search> b </search>", "<search> A </search>", "<search> c"],
            (
                SearchCall("a", (), failed=True),
                SearchCall("b", (_p("Nice is in France."),)),
                SearchCall("A", (_p("Cannes."),)),
            ),
            attempts=4,
        ),
        _traj(["<answer> Paris </answer>"], (), attempts=0),
    ]
    prompts = PromptBatch(
        prompt_ids=((1,),) * 6,
        uids=tuple("abcdef"),
        data_sources=("nq",) * 3 + ("hotpotqa",) * 3,
        targets=(("Paris",), ("Paris", "City of Paris"), ("Paris",), ("Nice",), ("Nice",), ("Paris",)),
        questions=("q",) * 6,
        row_indices=tuple(range(6)),
    )
    return trajs, prompts


def test_doctests_of_the_diagnostics_and_the_attempt_rule():
    for module in (search_stats_module, actions_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


def test_helpers():
    assert contains_answer("the city of Paris.", ["City of Paris"]) and not contains_answer("Parisian", ["Paris"])
    assert not contains_answer("anything", ["", "  "]), "an empty gold answer matches nothing"
    assert duplicate_queries(["a b", "A  b!", "c", "a b"]) == 2 and duplicate_queries([]) == 0


def test_outcome_of_each_trajectory():
    trajs, prompts = hand_batch()
    results = score_trajectories(trajs, prompts, RewardConfig())
    diagnoses = [diagnose(t, g, r) for t, g, r in zip(trajs, prompts.targets, results, strict=True)]
    assert [d.outcome for d in diagnoses] == [
        "correct",
        "read_wrong",
        "retrieval_missed",
        "wrong_no_search",
        "no_answer",
        "correct",
    ]
    assert [d.gold_retrieved for d in diagnoses] == [True, True, False, False, True, False]
    assert [d.duplicates for d in diagnoses] == [0, 1, 0, 0, 1, 0]
    assert [d.answer_words for d in diagnoses] == [1, 1, 3, 1, None, 1]
    assert [d.answer_source for d in diagnoses] == [None, "other_passage", None, None, None, None]


def test_where_read_wrong_answers_came_from(tmp_path, capsys):
    """Read wrong, split by the passage the answer occurs in: the gold's own (the wrong span of the right passage),
    one without the gold, none; a right answer and a missed retrieval have no source."""
    shown = (
        SearchCall("q", (_p("Gustave Eiffel built the tower in Paris in 1889.", "Eiffel Tower"),)),
        SearchCall("r", (_p("Lyon is a city in France."),)),
    )
    answers = ["Gustave Eiffel", "1889 tower", "Lyon", "Berlin", "Paris", "Nice"]
    trajs = [_traj(["<search> q </search>", f"<answer> {a} </answer>"], shown, attempts=1) for a in answers[:5]]
    trajs.append(_traj(["<search> r </search>", "<answer> Nice </answer>"], shown[1:], attempts=1))
    n = len(trajs)
    prompts = PromptBatch(
        prompt_ids=((1,),) * n,
        uids=tuple("abcdef"),
        data_sources=("nq",) * n,
        targets=(("Paris",),) * n,
        questions=("q",) * n,
        row_indices=tuple(range(n)),
    )
    results = score_trajectories(trajs, prompts, RewardConfig())
    diagnoses = [diagnose(t, g, r) for t, g, r in zip(trajs, prompts.targets, results, strict=True)]
    assert [d.outcome for d in diagnoses] == ["read_wrong"] * 4 + ["correct", "retrieval_missed"]
    # "1889 tower" is not a contiguous span of any passage, so it was reworded or made up
    sources = ["gold_passage", "not_shown", "other_passage", "not_shown", None, None]
    assert [d.answer_source for d in diagnoses] == sources
    m = answer_metrics(trajs, results, prompts.data_sources, "eval", prompts.targets)
    shares = [m[f"eval/all/read_wrong_{k}"] for k in ("gold_passage", "other_passage", "not_shown")]
    assert shares == pytest.approx([1 / 6, 1 / 6, 2 / 6])
    parts = sum(m[f"eval/all/read_wrong_{k}"] for k in ("gold_passage", "other_passage", "not_shown"))
    assert parts == pytest.approx(m["eval/all/read_wrong"])
    (tmp_path / "metrics.json").write_text(json.dumps(m))
    assert diagnose_tool.main(["--eval", str(tmp_path)]) == 0
    assert "| eval/all | 0.667 | 0.167 | 0.167 | 0.333 |" in capsys.readouterr().out


def test_step_metrics_by_hand():
    trajs, prompts = hand_batch()
    results = score_trajectories(trajs, prompts, RewardConfig())
    m = search_metrics(trajs, results, prompts.targets, "rollout")
    expected = {
        "rollout/search_attempts": 9 / 6,
        "rollout/valid_search_rate": 7 / 9,  # A1 + B2 + C1 + E3 sent, of 9 attempts
        "rollout/duplicate_query_rate": 2 / 7,  # B's second query, E's "A"
        "rollout/gold_retrieved": 3 / 6,  # A, B, E
        "rollout/no_answer": 1 / 6,
        "rollout/wrong_no_search": 1 / 6,
        "rollout/retrieval_missed": 1 / 6,
        "rollout/read_wrong": 1 / 6,
        "rollout/read_wrong_gold_passage": 0.0,
        "rollout/read_wrong_other_passage": 1 / 6,  # B's "Lyon" is in the passage without Paris
        "rollout/read_wrong_not_shown": 0.0,
        "rollout/answer_words_mean": 7 / 5,  # 1 + 1 + 3 + 1 + 1 words over the 5 answers
        "rollout/n_searches_0": 2.0,  # D, F
        "rollout/em_searches_0": 0.5,
        "rollout/n_searches_1": 2.0,  # A, C
        "rollout/em_searches_1": 0.5,
        "rollout/n_searches_2": 1.0,  # B
        "rollout/em_searches_2": 0.0,
        "rollout/n_searches_3plus": 1.0,  # E
        "rollout/em_searches_3plus": 0.0,
        "rollout/n_yes_no": 0.0,  # no yes/no question: their EM and answer share are absent, not 0
    }
    assert m == pytest.approx(expected)
    em = sum(r.components["em"] for r in results) / len(results)
    shares = sum(m[f"rollout/{k}"] for k in ("no_answer", "wrong_no_search", "retrieval_missed", "read_wrong"))
    assert em + shares == pytest.approx(1.0)


def test_yes_no_questions(tmp_path, capsys):
    """Yes/no questions: right ("Yes." for yes), answered with the wrong judgement, answered with an entity
    ("Nobody" is not "no"); beside them a question with one yes/no gold among others, which is not one."""
    seen = (SearchCall("q", (_p("Both are American."),)),)
    trajs = [
        _traj(["<search> q </search>", "<answer> Yes. </answer>"], seen, attempts=1),
        _traj(["<search> q </search>", "<answer> yes </answer>"], seen, attempts=1),
        _traj(["<search> q </search>", "<answer> Nobody </answer>"], seen, attempts=1),
        _traj(["<search> q </search>", "<answer> no </answer>"], seen, attempts=1),
    ]
    prompts = PromptBatch(
        prompt_ids=((1,),) * 4,
        uids=tuple("abcd"),
        data_sources=("hotpotqa",) * 4,
        targets=(("yes",), ("No", ""), ("no",), ("no", "Paris")),
        questions=("q",) * 4,
        row_indices=tuple(range(4)),
    )
    results = score_trajectories(trajs, prompts, RewardConfig())
    assert [r.components["em"] for r in results] == [1.0, 0.0, 0.0, 1.0]
    diagnoses = [diagnose(t, g, r) for t, g, r in zip(trajs, prompts.targets, results, strict=True)]
    assert [(d.yes_no_question, d.yes_no_answer) for d in diagnoses] == [
        (True, True),
        (True, True),
        (True, False),
        (False, True),
    ]
    m = answer_metrics(trajs, results, prompts.data_sources, "eval", prompts.targets)
    assert m["eval/all/n_yes_no"] == 3.0
    assert m["eval/all/em_yes_no"] == pytest.approx(1 / 3)
    assert m["eval/all/yes_no_answered"] == pytest.approx(2 / 3)
    (tmp_path / "metrics.json").write_text(json.dumps(m))
    assert diagnose_tool.main(["--eval", str(tmp_path)]) == 0
    assert "| eval/all | 3 | 0.333 | 0.667 |" in capsys.readouterr().out


def test_eval_metrics_per_source_and_empty_cases():
    trajs, prompts = hand_batch()
    results = score_trajectories(trajs, prompts, RewardConfig())
    m = answer_metrics(trajs, results, prompts.data_sources, "eval", prompts.targets)
    assert m["eval/nq/valid_search_rate"] == 1.0 and m["eval/hotpotqa/valid_search_rate"] == pytest.approx(3 / 5)
    assert m["eval/nq/duplicate_query_rate"] == pytest.approx(1 / 4)
    assert m["eval/hotpotqa/duplicate_query_rate"] == pytest.approx(1 / 3)
    assert m["eval/nq/gold_retrieved"] == pytest.approx(2 / 3) and m["eval/hotpotqa/gold_retrieved"] == pytest.approx(
        1 / 3
    )
    assert (m["eval/nq/read_wrong"], m["eval/nq/no_answer"]) == (pytest.approx(1 / 3), 0.0)
    assert m["eval/hotpotqa/answer_words_mean"] == 1.0 and m["eval/nq/answer_words_mean"] == pytest.approx(5 / 3)
    # an empty bucket has a count of 0 and no EM (a 0 would read as "searching once never works")
    assert m["eval/nq/n_searches_0"] == 0.0 and "eval/nq/em_searches_0" not in m
    assert m["eval/hotpotqa/em_searches_0"] == 0.5 and m["eval/all/n_searches_3plus"] == 1.0
    assert m["eval/all/valid_search_rate"] == pytest.approx(7 / 9)
    # without gold answers only the answer metrics (what callers without targets got before)
    assert not any("valid_search_rate" in k for k in answer_metrics(trajs, results, prompts.data_sources, "val"))
    # no attempt, no search: rates are 0, not a division by zero
    f_only = search_metrics(trajs[5:], results[5:], prompts.targets[5:], "r")
    assert (f_only["r/valid_search_rate"], f_only["r/duplicate_query_rate"], f_only["r/gold_retrieved"]) == (0, 0, 0)


def test_diagnose_prints_the_eval_breakdown(tmp_path, capsys, caplog):
    trajs, prompts = hand_batch()
    results = score_trajectories(trajs, prompts, RewardConfig())
    metrics = answer_metrics(trajs, results, prompts.data_sources, "eval", prompts.targets)
    (tmp_path / "metrics.json").write_text(json.dumps({"model": "m", "baseline": "search", **metrics}))
    assert diagnose_tool.main(["--eval", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out.split("EM by number of searches")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| eval/")]
    assert [r[0] for r in rows] == ["| eval/hotpotqa", "| eval/nq", "| eval/all"], "sources first, the total last"
    # n, EM, answered, searches, valid search, dup. queries, gold retrieved, no answer, no search, missed, read wrong
    assert rows[1][1:12] == [
        "3",
        "0.333",
        "1.000",
        "1.33",
        "1.000",
        "0.250",
        "0.667",
        "0.000",
        "0.000",
        "0.333",
        "0.333",
    ]
    assert "| eval/all | 0.500 (2) | 0.500 (2) | 0.000 (1) | 0.000 (1) |" in out
    assert "| eval/nq | - (0) | 0.500 (2) | 0.000 (1) | - (0) |" in out

    # a training run's folder: its last validation record
    tracker = build_tracker(["jsonl"], tmp_path / "run", 2, "p", "e", {})
    tracker.log({"val/all/n": 4.0, "val/all/read_wrong": 0.25}, 1)
    tracker.log({"reward/em": 0.1}, 2)
    tracker.close()
    assert diagnose_tool.main(["--eval", str(tmp_path / "run")]) == 0
    assert "| val/all | 4 | - |" in capsys.readouterr().out
    assert diagnose_tool.main(["--eval", str(tmp_path / "nowhere")]) == 2

    # the output_dir given to main_eval: its newest run below it, not an older one
    for stamp, em in (("search-20261101-000000", 0.125), ("search-20261102-000000", 0.75)):
        run = tmp_path / "evals" / stamp
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({"eval/all/n": 8, "eval/all/em": em}))
        (run / "trajectories.jsonl").write_text("")
    assert diagnose_tool.main(["--eval", str(tmp_path / "evals")]) == 0
    out = capsys.readouterr().out
    assert "| eval/all | 8 | 0.750 |" in out and "0.125" not in out
    (tmp_path / "empty").mkdir()
    assert diagnose_tool.main(["--eval", str(tmp_path / "empty")]) == 2
    assert "no main_eval run" in caplog.text
