"""The training row: question normalisation, globally unique ids, the Search-R1 row schema, parquet I/O.

Row schema (one parquet row per question; Search-R1's ``RLHFDataset`` reads the same columns)::

    data_source   str                       the SOURCE name given on the command line ("nq", "hotpotqa", ...)
    prompt        [{"role": "user", "content": str}]   the rendered template with the question in it
    ability       str                       always "fact-reasoning" (Search-R1's value)
    reward_model  {"style": "rule", "ground_truth": {"target": [str, ...]}}
    extra_info    {"split": str, "index": int, "id": str}
    question      str                       the normalised question alone (for baselines and retrieval checks)

Question normalisation policy (applied to every question, whatever its format):

1. Every run of whitespace (spaces, tabs, newlines) becomes one space; leading and trailing whitespace goes.
2. If the question does not end with ``?``, a ``?`` is appended. This is Search-R1's rule (its ``nq_search.py``
   appends ``?`` the same way), so the same NQ question read from Google's NQ-open file, FlashRAG's jsonl or
   Search-R1's parquet becomes the same string, and therefore the same prompt and the same hash id.
   Questions ending in ``.`` or a quote also get the ``?``; nothing else is rewritten.

Case, punctuation inside the question and Unicode are left as they are. Answers are only stripped, and empty
strings and exact duplicates are removed (order kept); matching answers loosely is the reward's job.

Ids: ``extra_info.id`` is ``<source>-<split>-<key>`` where ``key`` is the dataset's own question id when the format
has a real one (HotpotQA ``_id``, IRCoT ``question_id``, MuSiQue ``id``, FlashRAG/Search-R1 ``id``), otherwise
``q`` + the first 16 hex digits of the SHA-256 of the normalised question. The source prefix keeps ids unique
across datasets, which GRPO relies on to group samples of the same question.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ABILITY = "fact-reasoning"
SPLITS = ("train", "val", "test")
_WS = re.compile(r"\s+")
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9_.]+$")

PROMPT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
REWARD_MODEL_TYPE = pa.struct(
    [("style", pa.string()), ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))]
)
EXTRA_INFO_TYPE = pa.struct([("split", pa.string()), ("index", pa.int64()), ("id", pa.string())])
ROW_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT_TYPE),
        ("ability", pa.string()),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
        ("question", pa.string()),
    ]
)


def normalise_question(text: str) -> str:
    """Apply the question normalisation policy of this module (collapse whitespace, strip, end with ``?``).

    >>> normalise_question("  who wrote\\thamlet ")
    'who wrote hamlet?'
    >>> normalise_question("Is Paris in France?")
    'Is Paris in France?'
    """
    question = _WS.sub(" ", text).strip()
    if question and not question.endswith("?"):
        question += "?"
    return question


def check_source_name(source: str) -> str:
    """Return ``source`` if it is usable as a data source name (it becomes part of every id), else raise."""
    if not _SOURCE_NAME.match(source):
        raise ValueError(
            f"data source name {source!r} may use only letters, digits, '_' and '.' "
            "(it becomes the prefix of every row id), e.g. nq, hotpotqa, 2wikimultihopqa"
        )
    return source


def question_key(question: str) -> str:
    """Stable key of a normalised question: ``q`` + 16 hex digits of its SHA-256.

    >>> question_key("who wrote hamlet?")
    'q6dfd7ac2aac4e96a'
    """
    return "q" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


def make_row_id(source: str, split: str, question: str, native_id: str | None) -> str:
    """Globally unique row id ``<source>-<split>-<native id or question key>``."""
    return f"{source}-{split}-{native_id if native_id is not None else question_key(question)}"


def make_row(
    *, source: str, split: str, index: int, row_id: str, question: str, answers: Sequence[str], prompt: str
) -> dict[str, Any]:
    """Build one Search-R1 row (see the module docstring for the schema)."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": list(answers)}},
        "extra_info": {"split": split, "index": index, "id": row_id},
        "question": question,
    }


def _row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a row's types, or None. pyarrow alone would e.g. turn a string target into a char list."""
    if set(row) != set(ROW_SCHEMA.names):
        return f"columns {sorted(row)} differ from {sorted(ROW_SCHEMA.names)}"
    for col in ("data_source", "ability", "question"):
        if not isinstance(row[col], str) or not row[col]:
            return f"{col} must be a non-empty string"
    prompt = row["prompt"]
    if not (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    ):
        return "prompt must be a non-empty list of {'role': str, 'content': str}"
    reward_model = row["reward_model"] if isinstance(row["reward_model"], dict) else {}
    ground_truth = reward_model.get("ground_truth")
    ground_truth = ground_truth if isinstance(ground_truth, dict) else {}
    target = ground_truth.get("target")
    if not (isinstance(target, list) and target and all(isinstance(a, str) and a for a in target)):
        return "reward_model.ground_truth.target must be a non-empty list of non-empty strings"
    info = row["extra_info"]
    if not (
        isinstance(info, dict)
        and isinstance(info.get("split"), str)
        and isinstance(info.get("index"), int)
        and isinstance(info.get("id"), str)
        and info["id"]
    ):
        return "extra_info must be {'split': str, 'index': int, 'id': non-empty str}"
    return None


def write_rows(rows: Sequence[dict[str, Any]], out: Path) -> None:
    """Write rows to ``out`` as zstd-compressed parquet with :data:`ROW_SCHEMA` (atomic replace).

    The same rows give the same bytes with the same pyarrow version, so rebuilds can be compared by hash.

    Raises:
        ValueError: a row does not match the schema (the message gives its position and what is wrong).
    """
    for i, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            info = row.get("extra_info")
            row_id = info.get("id") if isinstance(info, dict) else None
            raise ValueError(f"row {i} (id {row_id!r}) cannot be written: {problem}")
    table = pa.Table.from_pylist(list(rows), schema=ROW_SCHEMA)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, out)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read a parquet file of rows back as plain Python dicts (nested fields as lists and dicts)."""
    return pq.read_table(path).to_pylist()
