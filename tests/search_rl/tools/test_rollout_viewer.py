"""The rollout viewer, headless with textual's Pilot, on a dump written by the trainer's own ``RolloutDumper``.

Run: python -m pytest tests/search_rl/tools/test_rollout_viewer.py -q
"""

from __future__ import annotations

import asyncio

import torch
from textual.widgets import DataTable, Input, Select, Static

from search_rl.batches import PromptBatch
from search_rl.datatypes import Passage, RewardResult, SearchCall, Segment, Trajectory, TrajectoryStats
from search_rl.tools.rollout_viewer import ALL, Filters, RolloutViewer, filter_records, load_records, render_record
from search_rl.tracking import RolloutDumper

PASSAGE = '<information>Doc 1 (Title: "Nobel Prize") Wilhelm Rontgen received the first prize.</information>'


def _trajectory(tokenizer, query: str, answer: str) -> Trajectory:
    turn1 = f"<think> I need to look this up. </think><search> {query} </search>"
    turn2 = f"<answer> {answer} </answer>"
    parts = [
        (k, t, tokenizer.encode(t, add_special_tokens=False))
        for k, t in (("model", turn1), ("observation", PASSAGE), ("model", turn2))
    ]
    ids, mask, segments, start = [], [], [], 0
    for kind, text, part in parts:
        ids += part
        mask += [int(kind == "model")] * len(part)
        segments.append(Segment(kind, start, start + len(part), text))
        start += len(part)
    return Trajectory(
        prompt_ids=torch.tensor(tokenizer.encode("Question?", add_special_tokens=False)),
        response_ids=torch.tensor(ids),
        response_mask=torch.tensor(mask),
        rollout_logprobs=torch.zeros(len(ids)),
        segments=tuple(segments),
        final_answer=answer,
        stop_reason="answer",
        stats=TrajectoryStats(turns=2, searches=1, search_attempts=1),
        search_calls=(SearchCall(query, (Passage("7", "Nobel Prize", "Wilhelm Rontgen received the first prize."),)),),
    )


def _write_run(run, tokenizer) -> None:
    dumper = RolloutDumper(run / "rollouts", tokenizer)
    questions = ("who got the first nobel prize in physics", "capital of france")
    prompts = PromptBatch(
        ((1, 2),) * 2, ("u1", "u2"), ("nq", "hotpotqa"), (("Wilhelm Rontgen",), ("Paris",)), questions, (0, 1)
    )
    trajs = [
        _trajectory(tokenizer, "first nobel prize physics", "Wilhelm Rontgen"),
        _trajectory(tokenizer, "capital of france", "Lyon"),
    ]
    for step in (1, 2):
        dumper.dump("train", step, prompts, trajs, [RewardResult(1.0, {"em": 1.0}), RewardResult(0.0, {"em": 0.0})])


def test_load_filter_render(tmp_path, tokenizer):
    _write_run(tmp_path, tokenizer)
    records = load_records(tmp_path)
    assert len(records) == 4 and records[0]["_file"] == "train_step_000001.jsonl"
    assert len(filter_records(records, Filters(source="nq"))) == 2
    assert len(filter_records(records, Filters(reward="positive", step="train:2"))) == 1
    assert [records[i]["answer"] for i in filter_records(records, Filters(text="LYON"))] == ["Lyon", "Lyon"]
    text = render_record(records[0])
    plain = text.plain
    assert "[SEARCH] first nobel prize physics" in plain and "[ANSWER] Wilhelm Rontgen" in plain
    assert "masked" in plain and "Wilhelm Rontgen received the first prize" in plain
    # the retrieved passage is drawn in its own style, distinct from the model's text
    start = plain.index("Wilhelm Rontgen received")
    styles = {str(span.style) for span in text.spans if span.start <= start < span.end}
    assert "white on grey15" in styles
    # the search diagnosis: the first answer is right, the second wrong, and no passage shown held "Paris"
    assert "outcome:  correct · gold retrieved: yes" in plain
    assert "outcome:  retrieval_missed · gold retrieved: no" in render_record(records[1]).plain
    assert records[1]["search_calls"] == [
        {"query": "capital of france", "passage_ids": ["7"], "failed": False, "retrieval_key": None}
    ]
    assert "search 1: 'capital of france' · not recorded" in render_record(records[1]).plain
    assert filter_records(records, Filters(text="retrieval_missed")) == [1, 3]
    assert records[0]["answer_source"] is None and records[1]["answer_source"] is None


def test_read_wrong_shows_where_the_answer_came_from(tmp_path, tokenizer):
    """A wrong answer taken from the passage that holds the gold: the record and the view say so, and the search box
    finds it by that source."""
    prompts = PromptBatch(((1, 2),), ("u1",), ("nq",), (("Wilhelm Rontgen",),), ("who got the first nobel",), (0,))
    traj = _trajectory(tokenizer, "first nobel prize physics", "the first prize")
    RolloutDumper(tmp_path / "rollouts", tokenizer).dump("train", 1, prompts, [traj], [RewardResult(0.0, {"em": 0.0})])
    records = load_records(tmp_path)
    assert (records[0]["outcome"], records[0]["answer_source"]) == ("read_wrong", "gold_passage")
    assert "read_wrong · gold retrieved: yes · answer from: gold_passage" in render_record(records[0]).plain
    assert filter_records(records, Filters(text="gold_passage")) == [0]


def test_tui_filters_and_search(tmp_path, tokenizer):
    _write_run(tmp_path, tokenizer)

    async def drive() -> None:
        app = RolloutViewer(load_records(tmp_path), str(tmp_path))
        async with app.run_test(size=(160, 50)) as pilot:
            table = app.query_one(DataTable)
            assert table.row_count == 4
            body = app.query_one("#body", Static)
            assert "first nobel prize" in str(body.render())
            await pilot.press("n")  # the next trajectory
            await pilot.pause()
            assert "capital of france" in str(body.render())
            app.query_one("#source", Select).value = "hotpotqa"
            await pilot.pause()
            assert table.row_count == 2
            app.query_one("#source", Select).value = ALL
            app.query_one("#reward", Select).value = "positive"
            await pilot.pause()
            assert table.row_count == 2 and "Wilhelm Rontgen" in str(body.render())
            app.query_one("#step", Select).value = "train:2"
            await pilot.pause()
            assert table.row_count == 1
            app.query_one("#step", Select).value = ALL
            app.query_one("#reward", Select).value = ALL
            await pilot.press("slash")
            assert isinstance(app.focused, Input)
            await pilot.press(*"lyon")
            await pilot.pause()
            assert table.row_count == 2 and "capital of france" in str(body.render())
            await pilot.press("escape", "q")

    asyncio.run(drive())
