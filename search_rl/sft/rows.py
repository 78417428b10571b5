"""The warm-start row format on disk: question rows in (``data_prep.qa_to_parquet``'s parquet), SFT rows out (the same
columns plus ``trajectory`` and ``sft``), shared by ``data_prep.synth_sft`` (synthesised trajectories) and
``search_rl.tools.rft_rows`` (the policy's own right answers) and read back by ``sft/data.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("data_source", "question", "reward_model", "extra_info")
"""The question-row columns a warm-start file is built from."""

PASSAGE_TYPE = pa.struct([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])
TURN_TYPE = pa.struct([("text", pa.string()), ("passages", pa.list_(PASSAGE_TYPE))])
SFT_TYPE = pa.struct(
    [("variant", pa.string()), ("num_searches", pa.int64()), ("answer", pa.string()), ("support_passage", pa.string())]
)


def read_input(path: Path, max_rows: int | None = None) -> tuple[pa.Schema, list[dict[str, Any]]]:
    """The input's schema and rows (the first ``max_rows``).

    Raises:
        ValueError: the file cannot be read, lacks a required column, or a row lacks its id or gold answers.
    """
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise ValueError(f"cannot read input {path}: {e}") from e
    for col in REQUIRED_COLUMNS:
        if col not in table.column_names:
            raise ValueError(
                f"input {path} has no column {col!r} (columns: {table.column_names}); "
                "give rows written by data_prep.qa_to_parquet"
            )
    for col in ("trajectory", "sft"):
        if col in table.column_names:
            raise ValueError(f"input {path} already has a {col!r} column; give the question rows, not an SFT file")
    rows = table.slice(0, max_rows).to_pylist() if max_rows is not None else table.to_pylist()
    for i, r in enumerate(rows):
        try:
            ok = bool(r["extra_info"]["id"]) and bool(r["reward_model"]["ground_truth"]["target"]) and r["question"]
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise ValueError(
                f"input {path} row {i}: needs extra_info.id, question and reward_model.ground_truth.target"
            )
    return table.schema.remove_metadata(), rows


def write_output(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    """Write rows as zstd parquet: the input schema plus ``trajectory`` and ``sft`` (atomic replace)."""
    schema = schema.append(pa.field("trajectory", pa.list_(TURN_TYPE))).append(pa.field("sft", SFT_TYPE))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp, compression="zstd")
    os.replace(tmp, path)
