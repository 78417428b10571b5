"""Prompt data: parquet rows, tokenized prompts, GRPO groups keyed by the global id, a loader that resumes exactly.

Run: python -m pytest tests/search_rl/test_prompt_data.py -q
"""

from __future__ import annotations

import pandas as pd
import pytest

from search_rl.prompt_data import PromptDataset, PromptLoader, read_rows

TRAIN = "data/datasets/nq_hotpotqa_mini/train.parquet"


@pytest.fixture(scope="module")
def dataset(tokenizer) -> PromptDataset:
    rows = read_rows([TRAIN])[:40]
    return PromptDataset(rows, tokenizer, max_prompt_tokens=512, drop_overlong=False)


def test_rows_and_prompts(dataset, tokenizer):
    assert len(dataset) == 40
    row, ids = dataset.rows[0], dataset.prompt_ids[0]
    assert row.uid.startswith(("nq-train-", "hotpotqa-train-")) and row.targets and row.question
    assert tokenizer.decode(list(ids)).rstrip().endswith("<|im_start|>assistant")  # generation prompt at the end


def test_samples_per_prompt_share_the_global_id(dataset):
    batch = PromptLoader(dataset, batch_size=4, n_samples=3, shuffle=True, seed=0).next_batch()
    assert len(batch) == 12
    groups = [batch.uids[i : i + 3] for i in range(0, 12, 3)]
    assert all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == 4
    assert all(batch.prompt_ids[i] == batch.prompt_ids[i - i % 3] for i in range(12))


def test_loader_resumes_exactly_mid_epoch_and_across_epochs(dataset):
    a = PromptLoader(dataset, batch_size=8, n_samples=2, shuffle=True, seed=3)
    for _ in range(3):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch().uids for _ in range(5)]  # crosses into epoch 1 (5 batches per epoch)
    b = PromptLoader(dataset, batch_size=8, n_samples=2, shuffle=True, seed=3)
    b.load_state_dict(state)
    assert [b.next_batch().uids for _ in range(5)] == expected
    assert b.epoch == 1
    epoch0 = PromptLoader(dataset, batch_size=8, n_samples=1, shuffle=True, seed=3)
    seen = [u for _ in range(5) for u in epoch0.next_batch().uids]
    assert len(set(seen)) == 40  # an epoch visits every row once


def test_state_of_another_dataset_is_refused(dataset):
    loader = PromptLoader(dataset, batch_size=8, n_samples=1, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="saw 41 rows"):
        loader.load_state_dict({"epoch": 0, "batches_taken": 1, "num_rows": 41})


def test_overlong_prompts_dropped_or_refused(tokenizer):
    rows = read_rows([TRAIN])[:10]
    lengths = sorted(len(p) for p in PromptDataset(rows, tokenizer, 10_000, drop_overlong=False).prompt_ids)
    limit = lengths[4]
    kept = PromptDataset(rows, tokenizer, max_prompt_tokens=limit, drop_overlong=True)
    assert len(kept) == sum(n <= limit for n in lengths) < 10
    with pytest.raises(ValueError, match="filter_overlong_prompts"):
        PromptDataset(rows, tokenizer, max_prompt_tokens=limit, drop_overlong=False)


def test_duplicate_ids_and_missing_columns_are_errors(tmp_path):
    frame = pd.read_parquet(TRAIN).head(2)
    frame["extra_info"] = [frame["extra_info"].iloc[0]] * 2
    frame.to_parquet(tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match="share extra_info.id"):
        read_rows([str(tmp_path / "dup.parquet")])
    frame.drop(columns=["reward_model"]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="lacks the columns \\['reward_model'\\]"):
        read_rows([str(tmp_path / "bad.parquet")])
    with pytest.raises(FileNotFoundError):
        read_rows(["no/such/file.parquet"])


def test_validation_subset_is_fixed_and_sorted(dataset):
    a, b = dataset.subset_indices(10, seed=1), dataset.subset_indices(10, seed=1)
    assert a == b == sorted(a) and len(set(a)) == 10
    assert dataset.subset_indices(None, seed=1) == list(range(40))


def _write_with(tmp_path, name: str, column: str, value, rows: list[int]) -> str:
    """The first 3 shipped rows with ``column`` replaced by ``value`` in ``rows`` (a parquet column has one type, so
    a change of type is applied to every row)."""
    frame = pd.read_parquet(TRAIN).head(3)
    values = list(frame[column])
    for i in rows:
        values[i] = value
    frame[column] = values
    path = tmp_path / f"{name}.parquet"
    frame.to_parquet(path)
    return str(path)


GT = {"style": "rule"}
BAD_ROWS = [
    # (case, column, value, rows changed, field named, what is said)
    ("string target", "reward_model", {**GT, "ground_truth": {"target": "produced by Quincy Jones"}}, [0, 1, 2],
     "reward_model.ground_truth.target", "valid list (got str 'produced by Quincy Jones')"),
    ("int target", "reward_model", {**GT, "ground_truth": {"target": 5}}, [0, 1, 2],
     "reward_model.ground_truth.target", "valid list (got int 5)"),
    ("int answer", "reward_model", {**GT, "ground_truth": {"target": [1990]}}, [0, 1, 2],
     "reward_model.ground_truth.target.0", "valid string (got int 1990)"),
    ("string reward_model", "reward_model", "rule", [0, 1, 2], "reward_model", "valid dictionary (got str 'rule')"),
    ("no ground_truth", "reward_model", GT, [0, 1, 2], "reward_model.ground_truth", "missing"),
    ("empty target list", "reward_model", {**GT, "ground_truth": {"target": []}}, [0, 1, 2],
     "reward_model.ground_truth.target", "empty"),
    ("empty question", "question", "", [1], "question", "blank"),
    ("empty prompt", "prompt", [], [1], "prompt", "empty"),
    ("blank message", "prompt", [{"role": "user", "content": "  "}], [1], "prompt.0.content", "blank"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "column", "value", "rows", "field", "said"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_invalid_rows_are_refused_naming_file_row_and_field(tmp_path, case, column, value, rows, field, said):
    path = _write_with(tmp_path, case.replace(" ", "_"), column, value, rows)
    with pytest.raises(ValueError) as info:
        read_rows([path])
    message = str(info.value)
    assert message.startswith(f"{path}: {len(rows)} of 3 rows are invalid")
    assert f"row {rows[0]}: {field}: " in message and said in message.splitlines()[1]


def test_valid_rows_keep_whole_answers(tmp_path):
    path = _write_with(tmp_path, "multi", "reward_model", {**GT, "ground_truth": {"target": ["a b", "c"]}}, [0, 1, 2])
    assert [r.targets for r in read_rows([path])] == [("a b", "c")] * 3
