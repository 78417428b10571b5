"""``search_rl.tools.rft_rows``: the policy's right sampled trajectories become warm-start rows that replay them.

A real rollout (the tiny model scripted to search and answer, the HF engine, a real uvicorn BM25 retriever over the
shipped corpus) is recorded exactly as ``main_eval`` records it; the tool turns the right records whose answer the
policy was shown into SFT rows, and ``SFTDataset`` must rebuild from them the very tokens and loss mask the rollout
produced.

Run: python -m pytest tests/search_rl/tools/test_rft_rows.py -q
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data_prep.retrieval import blocking_search
from retriever_server.settings import SHIPPED_CORPUS
from search_rl.batches import PromptBatch
from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.datatypes import GroundTruth
from search_rl.prompt_data import encode_prompt
from search_rl.reward import compute_reward
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.sft.dataset import SFTDataset
from search_rl.sft.rows import read_input
from search_rl.sft.trajectories import contains_answer
from search_rl.tools.rft_rows import main, skip_reason
from search_rl.tracking.jsonl import read_jsonl
from search_rl.tracking.rollout_dump import trajectory_record

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parents[3] / "data" / "datasets" / "nq_hotpotqa_mini" / "train.parquet"
ROLLOUT = RolloutConfig(search_turns=2, max_turn_tokens=64, max_obs_tokens=512, temperature=1.0)


@pytest.fixture
def sampled(tmp_path, tokenizer, make_scripted_engine, retriever_url):
    """(question parquet, evaluation folder, the rollout's trajectories), recorded as main_eval records them:
    question A searches and answers right from what it was shown (its record twice: a duplicate), question B
    answers wrong, question C answers right after a search that showed nothing holding the answer (a guess)."""
    schema, rows = read_input(TRAIN, max_rows=40)
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=3))
    found = blocking_search(client, 3)([r["question"] for r in rows])
    golds = [r["reward_model"]["ground_truth"]["target"] for r in rows]
    shows = [
        next((g for g in gs if any(contains_answer(f"{p.title} {p.text}", g) for p in ps)), None)
        for gs, ps in zip(golds, found, strict=True)
    ]
    a = next(i for i, g in enumerate(shows) if g is not None)  # the question's own words retrieve its answer
    b, c = [i for i in range(len(rows)) if i != a and shows[i] is None][:2]
    rows = [rows[a], rows[b], rows[c]]
    questions = tmp_path / "questions.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), questions)
    prompts = [encode_prompt(tokenizer, list(r["prompt"])) for r in rows]
    scripts = {
        tuple(prompts[0]): [f"<search> {rows[0]['question']} </search>", f"<answer> {shows[a]} </answer>"],
        tuple(prompts[1]): ["<answer> certainly not the answer </answer>"],
        tuple(prompts[2]): [f"<search> {rows[2]['question']} </search>", f"<answer> {golds[c][0]} </answer>"],
    }
    result = LLMGenerationManager(make_scripted_engine(scripts), tokenizer, client, ROLLOUT).generate(prompts, seed=0)
    batch = PromptBatch(
        prompt_ids=tuple(tuple(p) for p in prompts),
        uids=tuple(r["extra_info"]["id"] for r in rows),
        data_sources=tuple(r["data_source"] for r in rows),
        targets=tuple(tuple(r["reward_model"]["ground_truth"]["target"]) for r in rows),
        questions=tuple(r["question"] for r in rows),
        row_indices=(0, 1, 2),
    )
    records = []
    for i, traj in enumerate(result.trajectories):
        reward = compute_reward(traj, GroundTruth(batch.targets[i], batch.data_sources[i]))
        records.append(trajectory_record(traj, reward, batch, i, tokenizer, step=0, kind="eval"))
    assert [r["reward_components"]["em"] for r in records] == [1.0, 0.0, 1.0]
    assert [r["stats"]["searches"] for r in records] == [1, 0, 1]
    run = tmp_path / "eval"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    lines = [*records, {**records[0], "sample": 1}]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return questions, run, result.trajectories


def test_right_samples_become_rows_that_replay_the_rollout(sampled, tokenizer, tmp_path, capsys):
    questions, run, trajectories = sampled
    out = tmp_path / "rft.parquet"
    argv = ["--records", str(run), "--questions", str(questions), "--corpus", str(SHIPPED_CORPUS), "--output", str(out)]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["records_read"] == 4 and manifest["rows_kept"] == 1 and manifest["questions_kept"] == 1
    assert manifest["skipped_by_reason"] == {"not_exact": 1, "answer_not_shown": 1, "duplicate": 1}
    assert "kept 1 rows of 1 questions" in capsys.readouterr().out
    dataset = SFTDataset([str(out)], tokenizer, ROLLOUT)
    assert not dataset.skipped and len(dataset) == 1
    rebuilt, sampled_traj = dataset.trajectories[0], trajectories[0]
    assert torch.equal(rebuilt.prompt_ids, sampled_traj.prompt_ids)
    assert torch.equal(rebuilt.response_ids, sampled_traj.response_ids)  # the passages, looked up by id, read the same
    assert torch.equal(rebuilt.response_mask, sampled_traj.response_mask)


def test_cap_per_question_and_bad_records(sampled, tokenizer, tmp_path, capsys):
    questions, run, _ = sampled
    lines = read_jsonl(run / "trajectories.jsonl")
    other = copy.deepcopy(lines[0])
    other["segments"][-1]["text"] = other["segments"][-1]["text"].replace("<answer>", "<answer> ")
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*lines, other]))
    out = tmp_path / "rft.parquet"
    base = ["--records", str(run), "--questions", str(questions), "--corpus", str(SHIPPED_CORPUS), "--output", str(out)]
    assert main([*base, "--max-per-question", "1"]) == 0
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["rows_kept"] == 1 and manifest["skipped_by_reason"]["over_cap"] == 1
    assert main(base) == 0  # a different right trajectory of the same question is a second row, with its own id
    assert json.loads((tmp_path / "rft.manifest.json").read_text())["rows_kept"] == 2
    uid = lines[0]["uid"]
    assert [r["extra_info"]["id"] for r in pq.read_table(out).to_pylist()] == [f"{uid}/rft0", f"{uid}/rft1"]
    assert len(SFTDataset([str(out)], tokenizer, ROLLOUT)) == 2

    broken = copy.deepcopy(lines[0])
    broken["segments"][0]["text"] = "<think> unclosed " + broken["segments"][0]["text"]
    (run / "trajectories.jsonl").write_text(json.dumps(broken) + "\n" + json.dumps(lines[0]) + "\n")
    assert main(base) == 0
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["rows_kept"] == 1 and manifest["skipped_by_reason"] == {"bad_format": 1}

    invalid = copy.deepcopy(lines[0])
    invalid["stats"]["invalid_actions"] = 1
    assert skip_reason(invalid) == "invalid_action"
    capsys.readouterr()
    unknown = copy.deepcopy(lines[0])
    unknown["search_calls"][0]["passage_ids"][0] = "no-such-passage"
    (run / "trajectories.jsonl").write_text(json.dumps(unknown) + "\n")
    assert main(base) == 1
    assert "passage id 'no-such-passage' is not in the corpus" in capsys.readouterr().err
    stranger = {**lines[0], "uid": "nq-train-unknown"}
    (run / "trajectories.jsonl").write_text(json.dumps(stranger) + "\n")
    assert main(base) == 1
    assert "record nq-train-unknown (sample 0) is not a question of --questions" in capsys.readouterr().err

    # fewer rows than asked for (e.g. a warm start whose right samples all think): refused, nothing written
    out.unlink()
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main([*base, "--min-rows", "2"]) == 1
    err = capsys.readouterr().err
    assert "only 1 rows of 1 questions qualify, fewer than --min-rows 2; nothing written" in err
    assert "'not_exact': 1" in err and not out.exists()
    assert main([*base, "--min-rows", "1"]) == 0 and out.exists()


def test_yes_no_answers_are_judged_not_copied(sampled, tokenizer, tmp_path):
    """A right yes/no answer after a search is a row although no passage holds the word (HotpotQA's comparison
    questions), and main_sft trains on it; any other answer the passages do not hold stays a guess."""
    questions, run, _ = sampled
    lines = read_jsonl(run / "trajectories.jsonl")
    guess = lines[2]
    assert skip_reason(guess) == "answer_not_shown"
    judged, named = copy.deepcopy(guess), copy.deepcopy(guess)
    judged["segments"][-1]["text"], judged["answer"] = "<answer> Yes </answer>", "Yes"
    named["segments"][-1]["text"], named["answer"] = "<answer> Noah </answer>", "Noah"
    assert not any("yes" in s["text"].lower().split() for s in judged["segments"] if s["kind"] == "observation")
    assert skip_reason(named) == "answer_not_shown"
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [lines[0], judged, named]))
    out = tmp_path / "rft.parquet"
    argv = ["--records", str(run), "--questions", str(questions), "--corpus", str(SHIPPED_CORPUS), "--output", str(out)]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["rows_kept"] == 2 and manifest["skipped_by_reason"] == {"answer_not_shown": 1}
    assert [r["sft"]["answer"] for r in pq.read_table(out).to_pylist()] == [lines[0]["answer"], "Yes"]
    dataset = SFTDataset([str(out)], tokenizer, ROLLOUT)
    assert not dataset.skipped and len(dataset) == 2  # the yes row is not cut as "answer_cut_from_observations"
    last = dataset.trajectories[1]
    assert tokenizer.decode(last.response_ids[last.response_mask.bool()]).endswith("<answer> Yes </answer>")


def test_pooled_runs_and_rows_without_think(sampled, tmp_path):
    questions, run, _ = sampled
    lines = read_jsonl(run / "trajectories.jsonl")
    thinking = copy.deepcopy(lines[0])
    # a sampled thought with a Unicode line separator, written raw as main_eval writes it: one record, not two
    thinking["segments"][0]["text"] = "<think> I should\u2028look this up. </think>\n" + thinking["segments"][0]["text"]
    second = tmp_path / "eval2"
    second.mkdir()
    (second / "metrics.json").write_text("{}")
    (second / "trajectories.jsonl").write_text(json.dumps(thinking, ensure_ascii=False) + "\n", encoding="utf-8")
    out = tmp_path / "rft.parquet"
    rest = ["--questions", str(questions), "--corpus", str(SHIPPED_CORPUS), "--output", str(out)]

    assert main(["--records", str(run), "--records", str(second), *rest]) == 0  # both runs are read
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["records_read"] == 5 and manifest["rows_kept"] == 2
    texts = [t["text"] for r in pq.read_table(out).to_pylist() for t in r["trajectory"]]
    assert any("<think> I should\u2028look" in t for t in texts)

    # the thinking record comes first and the cap is 1: leaving it out must not use up the question's one row
    argv = ["--records", str(second), "--records", str(run), *rest, "--max-per-question", "1", "--without-think"]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["rows_kept"] == 1
    assert manifest["skipped_by_reason"] == {"not_exact": 1, "answer_not_shown": 1, "has_think": 1, "duplicate": 1}
    (row,) = pq.read_table(out).to_pylist()
    assert row["extra_info"]["id"] == f"{lines[0]['uid']}/rft0"
    assert not any("<think>" in t["text"] for t in row["trajectory"])


def test_mix_appends_a_seeded_sample_of_warm_start_rows(sampled, tmp_path, capsys):
    questions, run, _ = sampled
    shipped = TRAIN.with_name("sft_train.parquet")
    out = tmp_path / "rft.parquet"
    base = ["--records", str(run), "--questions", str(questions), "--corpus", str(SHIPPED_CORPUS), "--output", str(out)]
    assert main([*base, "--mix", str(shipped), "--mix-seed", "3"]) == 0
    rft, mixed = pq.read_table(out).to_pylist()  # the one sampled row, then one row of the shipped file
    assert rft["extra_info"]["id"].endswith("/rft0")
    ids = [r["id"] for r in pq.read_table(shipped, columns=["extra_info"]).column("extra_info").to_pylist()]
    drawn = pd.Series(range(len(ids))).sample(n=1, random_state=3).tolist()  # what the manifest's seed reproduces
    assert mixed["extra_info"]["id"] == ids[drawn[0]] and mixed["trajectory"]
    manifest = json.loads((tmp_path / "rft.manifest.json").read_text())
    assert manifest["rows_kept"] == 1 and manifest["mixed_rows"] == 1 and manifest["mix_seed"] == 3
    assert "mixed in 1 rows" in capsys.readouterr().out

    assert main([*base, "--mix", str(questions)]) == 1  # question rows, not an SFT file
    assert "has columns" in capsys.readouterr().err
    assert main([*base, "--mix", str(run / "trajectories.jsonl")]) == 1  # not a parquet file
    assert f"cannot read --mix {run / 'trajectories.jsonl'}" in capsys.readouterr().err
    assert main(base) == 0  # the sampled row alone
    again = [*base[:-1], str(tmp_path / "again.parquet"), "--mix", str(out)]
    assert main(again) == 1  # mixing a file that holds the row sampled again
    assert "is also a sampled row's id" in capsys.readouterr().err
