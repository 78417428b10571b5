"""Metric sinks and rollout dumps: JSONL that rewinds on resume, optional sinks, records a viewer can render.

Run: python -m pytest tests/search_rl/tracking/test_tracking.py -q
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from search_rl.batches import PromptBatch
from search_rl.datatypes import RewardResult, Segment, Trajectory, TrajectoryStats
from search_rl.tracking import RolloutDumper, build_tracker, timer
from search_rl.tracking.jsonl import iter_jsonl, read_jsonl


def test_jsonl_history_and_rewind(tmp_path):
    tracker = build_tracker(["jsonl", "console"], tmp_path, 5, "p", "e", {})
    for step in (1, 2, 3):
        tracker.log({"reward/em": step / 10, "actor/kl_loss": float("nan")}, step)
    tracker.rewind(1)
    tracker.log({"reward/em": 0.9}, 2)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["reward/em"]) for x in lines] == [(1, 0.1), (2, 0.9)]
    assert lines[0]["actor/kl_loss"] is None  # non-finite values become null
    assert [s for s, _ in tracker.history] == [1, 2]


def test_optional_sinks(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # make `import wandb` fail
    with pytest.raises(ImportError, match="pip install wandb"):
        build_tracker(["wandb"], tmp_path, 1, "p", "e", {})
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    tracker = build_tracker(["tensorboard"], tmp_path, 1, "p", "e", {})
    assert tracker.sinks == [] and "tensorboard is not installed" in caplog.text


def test_timer_accumulates():
    metrics: dict[str, float] = {}
    with timer("phase", metrics):
        pass
    with timer("phase", metrics):
        pass
    assert metrics["timing/phase_s"] >= 0


def test_rollout_dump_records(tmp_path, tokenizer):
    prompt = tokenizer.encode("Question?", add_special_tokens=False)
    model, obs = tokenizer.encode("<search> x </search>"), tokenizer.encode("<information>Doc</information>")
    answer = tokenizer.encode("<answer> y\u2028z </answer>")  # model text may hold a Unicode line separator
    ids = model + obs + answer
    mask = [1] * len(model) + [0] * len(obs) + [1] * len(answer)
    a, b = len(model), len(model) + len(obs)
    traj = Trajectory(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(ids),
        response_mask=torch.tensor(mask),
        rollout_logprobs=torch.zeros(len(ids)),
        segments=(
            Segment("model", 0, a, "<search> x </search>"),
            Segment("observation", a, b, "<information>Doc"),
            Segment("model", b, len(ids), "<answer> y\u2028z </answer>"),
        ),
        final_answer="y",
        stop_reason="answer",
        stats=TrajectoryStats(turns=2, searches=1),
    )
    prompts = PromptBatch((tuple(prompt),) * 2, ("u1", "u1"), ("nq", "nq"), (("y",),) * 2, ("Question?",) * 2, (7, 7))
    path = RolloutDumper(tmp_path, tokenizer).dump(
        "train",
        3,
        prompts,
        [traj, traj],
        [RewardResult(1.0, {"em": 1.0})] * 2,
        advantages=[0.5, -0.5],
        weight_version=2,
    )
    assert path.name == "train_step_000003.jsonl"
    assert len(path.read_text(encoding="utf-8").splitlines()) > 2  # written raw: str.splitlines() would cut records
    records = read_jsonl(path)
    assert len(records) == 2 and records[0]["segments"][-1]["text"] == "<answer> y\u2028z </answer>"
    first = records[0]
    assert [r["sample"] for r in records] == [0, 1]
    assert first["mask_spans"] == [[0, a], [b, len(ids)]]
    assert first["response"] == tokenizer.decode(ids) and first["prompt"] == "Question?"
    assert first["gold"] == ["y"] and first["reward"] == 1.0 and first["advantage"] == 0.5
    assert first["stats"]["searches"] == 1 and first["weight_version"] == 2 and first["model_tokens"] == sum(mask)
    assert [s["kind"] for s in first["segments"]] == ["model", "observation", "model"]

    (tmp_path / "val_step_000005.jsonl").write_text("")
    RolloutDumper(tmp_path, tokenizer).rewind(3)  # a run restarted from step 3 drops the later dumps
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_step_000003.jsonl"]


def test_rewind_drops_a_line_cut_off_by_a_crash(tmp_path, caplog):
    tracker = build_tracker(["jsonl"], tmp_path, 5, "p", "e", {})
    for step in (1, 2, 3):
        tracker.log({"reward/em": step / 10}, step)
    path = tmp_path / "metrics.jsonl"
    text = path.read_text()
    path.write_text(text[: text.rindex("{") + 12])  # the step-3 line torn mid-write, no newline
    with caplog.at_level("WARNING"):
        build_tracker(["jsonl"], tmp_path, 5, "p", "e", {}).rewind(3)
    assert "metrics.jsonl line 3 is not a metrics record" in caplog.text
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]


def test_jsonl_reader_splits_records_on_newlines_only(tmp_path):
    records = [{"text": f"a{sep}b"} for sep in ("\u2028", "\u2029", "\x85", "\x1c", "\x0b", "\x0c", "\r")]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records) + "\n", encoding="utf-8")
    assert read_jsonl(path) == records
    path.write_text('{"step": 1}\n\n{"step": 2\n', encoding="utf-8")  # a blank line, then a torn record
    with pytest.raises(ValueError, match=r"records\.jsonl:3: not valid JSON"):
        list(iter_jsonl(path))
