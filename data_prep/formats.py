"""Readers for the QA file formats we accept, and auto-detection of which one a file is in.

Every reader turns one file into a stream of :class:`QARecord` (a question, its gold answers, the
record's own id if the format has a real one, and where it was read) or :class:`InvalidRecord` (why a
record could not be used, and where). Readers never raise on a bad record: the caller decides whether a
bad record is an error or a counted skip (``qa_to_parquet --skip-invalid``), so nothing is dropped
silently. Normalisation of the question text is not done here; see :mod:`data_prep.rows`.

Formats (``--format`` names), each with the raw files it reads:

- ``flashrag``: ``id``, ``question``, ``golden_answers: [str]``. FlashRAG ``test.jsonl``.
- ``nq_open``: ``question``, ``answer: [str]``. Google ``NQ-open.*.jsonl``.
- ``dpr``: ``question``, ``answers: [str]`` (``ctxs`` ignored). lost-in-the-middle ``nq-open-oracle.jsonl.gz``.
- ``hotpotqa``: ``question``, ``answer: str``, optional ``_id``/``id``. HippoRAG ``hotpotqa_train.json``, ReAct
  ``hotpot_dev_v1_simplified.json``, the official HotpotQA files.
- ``ircot``: ``question_id``, ``question_text``, ``answers_objects[{spans, number, date}]``. IRCoT
  ``dev_subsampled.jsonl``.
- ``musique``: ``id``, ``question``, ``answer``, ``answer_aliases``. HippoRAG ``musique_train.json``, MuSiQue.
- ``r1searcher``: ``idx``, ``question``, ``answer: str``. R1-Searcher ``stage_*.jsonl`` and eval ``*_500.jsonl``,
  ``bamboogle.jsonl``.
- ``triviaqa``: HF ``question``, ``question_id``, ``answer: {value, aliases}``, or the official JSON's ``{"Data":
  [{"Question", "QuestionId", "Answer": {"Value", "Aliases"}}]}``; ``popqa``: ``id``, ``question``,
  ``possible_answers`` (a list or a JSON-encoded one). Neither is in the snapshot (``data_prep/row_shapes.py``).
- ``searchr1_parquet``: ``question``, ``reward_model.ground_truth.target`` (or ``golden_answers``), ``id``.
  Search-R1's ``*.parquet`` and the files ``qa_to_parquet`` writes.

Containers: ``.jsonl`` (one object a line), ``.json`` (a JSON array of objects, or JSON lines), ``.parquet``;
``.gz`` is decompressed on the fly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from data_prep.containers import container_kind, decode
from data_prep.records import (
    NO_ANSWER,
    NO_QUESTION,
    UNREADABLE,
    FormatError,
    InvalidRecord,
    Item,
    Location,
    Parser,
    QARecord,
)
from data_prep.row_shapes import popqa_row, triviaqa_row

__all__ = [  # the record types live in data_prep.records; readers import them from here
    "FORMAT_NAMES",
    "NO_ANSWER",
    "NO_QUESTION",
    "UNREADABLE",
    "FormatError",
    "InvalidRecord",
    "Location",
    "QARecord",
    "decode",
    "detect_file_format",
    "detect_format",
    "read_records",
]

# ---------------------------------------------------------------------------------------------------------------
# Field helpers shared by the parsers


def _answers(value: Any, field: str, where: Location, kind: type) -> InvalidRecord | tuple[str, ...]:
    """Validate an answer field (``kind`` is ``str`` or ``list``) and return the cleaned answers, or why not."""
    if isinstance(value, kind) and kind is str:
        items: list[Any] = [value]
    elif isinstance(value, list | tuple) and kind is list:
        items = list(value)
    else:
        expected = "a string" if kind is str else "a list of strings"
        got = "missing" if value is None else f"a {type(value).__name__}"
        return InvalidRecord(NO_ANSWER, f"field {field!r} is {got}; expected {expected}", where)
    bad = [a for a in items if not isinstance(a, str)]
    if bad:
        return InvalidRecord(
            NO_ANSWER, f"field {field!r} holds a {type(bad[0]).__name__} ({bad[0]!r}), not a string", where
        )
    cleaned = tuple(dict.fromkeys(a.strip() for a in items if a.strip()))
    if not cleaned:
        return InvalidRecord(NO_ANSWER, f"field {field!r} has no non-empty answer", where)
    return cleaned


def _native_id(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value).strip()


def _record(
    row: Mapping[str, Any],
    where: Location,
    question_field: str,
    answer_field: str,
    answer_kind: type,
    native_id: Any = None,
    aliases_field: str | None = None,
) -> Item:
    """Build a QARecord from ``row[question_field]`` and ``row[answer_field]`` (+ aliases), or say what is wrong."""
    question = row.get(question_field)
    if not isinstance(question, str) or not question.strip():
        got = (
            "missing"
            if question is None
            else ("blank" if isinstance(question, str) else f"a {type(question).__name__}")
        )
        return InvalidRecord(NO_QUESTION, f"field {question_field!r} is {got}; expected a non-empty string", where)
    answers = _answers(row.get(answer_field), answer_field, where, answer_kind)
    if isinstance(answers, InvalidRecord):
        return answers
    if aliases_field and row.get(aliases_field):
        more = _answers(row[aliases_field], aliases_field, where, list)
        if isinstance(more, InvalidRecord):
            return more
        answers = tuple(dict.fromkeys(answers + more))
    return QARecord(question, answers, _native_id(native_id), where)


# ---------------------------------------------------------------------------------------------------------------
# One parser per format: a record (already decoded to a mapping) -> QARecord | InvalidRecord


def parse_flashrag(row: Mapping[str, Any], where: Location) -> Item:
    return _record(row, where, "question", "golden_answers", list, row.get("id"))


def parse_nq_open(row: Mapping[str, Any], where: Location) -> Item:
    return _record(row, where, "question", "answer", list)


def parse_dpr(row: Mapping[str, Any], where: Location) -> Item:
    return _record(row, where, "question", "answers", list)


def parse_hotpotqa(row: Mapping[str, Any], where: Location) -> Item:
    return _record(row, where, "question", "answer", str, row.get("_id", row.get("id")))


def parse_musique(row: Mapping[str, Any], where: Location) -> Item:
    return _record(row, where, "question", "answer", str, row.get("id"), aliases_field="answer_aliases")


def parse_r1searcher(row: Mapping[str, Any], where: Location) -> Item:
    # ``idx`` is only a row counter restarting at 1 in every file, not a dataset id: ids come from the question.
    return _record(row, where, "question", "answer", str)


def parse_triviaqa(row: Mapping[str, Any], where: Location) -> Item:
    return parse_flashrag(triviaqa_row(row), where)


def parse_popqa(row: Mapping[str, Any], where: Location) -> Item:
    return parse_flashrag(popqa_row(row), where)


def parse_ircot(row: Mapping[str, Any], where: Location) -> Item:
    objects = row.get("answers_objects")
    if not isinstance(objects, list) or not objects:
        return InvalidRecord(NO_ANSWER, "field 'answers_objects' is missing or empty", where)
    answers: list[Any] = []
    for obj in objects:
        if not isinstance(obj, Mapping):
            return InvalidRecord(NO_ANSWER, f"'answers_objects' holds a {type(obj).__name__}, not an object", where)
        answers.extend(obj.get("spans") or [])
        if obj.get("number"):
            answers.append(str(obj["number"]))
        date = obj.get("date") or {}
        parts = [str(date.get(k, "")).strip() for k in ("day", "month", "year")]
        if any(parts):
            answers.append(" ".join(p for p in parts if p))
    flat = {"question_text": row.get("question_text"), "answers_objects": answers}
    return _record(flat, where, "question_text", "answers_objects", list, row.get("question_id"))


def parse_searchr1(row: Mapping[str, Any], where: Location) -> Item:
    target = None
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and isinstance(reward_model.get("ground_truth"), Mapping):
        target = reward_model["ground_truth"].get("target")
    field = "reward_model.ground_truth.target"
    if target is None:
        target, field = row.get("golden_answers"), "golden_answers"
    if isinstance(target, str):
        target = [target]
    return _record({"question": row.get("question"), field: target}, where, "question", field, list, _searchr1_id(row))


def _searchr1_id(row: Mapping[str, Any]) -> str | None:
    """Search-R1's ``id`` column, or the key inside our own ``extra_info.id`` (``<source>-<split>-<key>``).

    Taking the key back out makes converting our own parquet again (same source and split) keep its ids.
    """
    if row.get("id") is not None:
        return _native_id(row["id"])
    info = row.get("extra_info")
    if isinstance(info, Mapping) and isinstance(info.get("id"), str):
        prefix = f"{row.get('data_source')}-{info.get('split')}-"
        if info["id"].startswith(prefix) and len(info["id"]) > len(prefix):
            return info["id"][len(prefix) :]
    return None


PARSERS: dict[str, Parser] = {
    "flashrag": parse_flashrag,
    "nq_open": parse_nq_open,
    "dpr": parse_dpr,
    "hotpotqa": parse_hotpotqa,
    "ircot": parse_ircot,
    "musique": parse_musique,
    "r1searcher": parse_r1searcher,
    "triviaqa": parse_triviaqa,
    "popqa": parse_popqa,
    "searchr1_parquet": parse_searchr1,
}
FORMAT_NAMES = tuple(PARSERS)


# ---------------------------------------------------------------------------------------------------------------
# Detection


def detect_format(path: Path, keys: set[str], sample: Mapping[str, Any]) -> str:
    """Name the format of ``path`` from the keys (and answer type) of its first readable record.

    Raises:
        FormatError: no format matches; the message lists the keys seen and how to name the format.
    """
    if container_kind(path) == "parquet" and "question" in keys and ({"reward_model", "golden_answers"} & keys):
        return "searchr1_parquet"
    if {"question_id", "question_text", "answers_objects"} <= keys:
        return "ircot"
    elif {"question", "possible_answers"} <= keys:
        return "popqa"
    elif {"Question", "Answer"} <= keys or ("question" in keys and isinstance(sample.get("answer"), Mapping)):
        return "triviaqa"
    elif {"question", "answer", "answer_aliases"} <= keys:
        return "musique"
    elif {"question", "golden_answers"} <= keys:
        return "flashrag"
    elif {"question", "answers"} <= keys:
        return "dpr"
    elif {"idx", "question", "answer"} <= keys:
        return "r1searcher"
    elif {"question", "answer"} <= keys:
        return "nq_open" if isinstance(sample.get("answer"), list) else "hotpotqa"
    hint = ""
    if keys <= {"id", "title", "text", "contents"} or "contents" in keys:
        hint = " It looks like a passage corpus, not QA data; corpora go through data_prep.build_corpus."
    raise FormatError(
        f"{path}: cannot tell the format from the record keys {sorted(keys)}.{hint} "
        f"Name it with --format, one of: {', '.join(FORMAT_NAMES)}."
    )


def detect_file_format(path: Path) -> str:
    """Name the format of ``path`` from its first readable record.

    Raises:
        FormatError: the file has no readable record, or its records match no format.
    """
    for _, obj in decode(path):
        if not isinstance(obj, InvalidRecord):
            return detect_format(path, set(obj), obj)
    raise FormatError(f"{path}: no readable record to detect the format from; name it with --format")


def read_records(path: Path, fmt: str | None = None) -> Iterator[Item]:
    """Read every record of ``path`` as :class:`QARecord` or :class:`InvalidRecord`, in file order.

    Args:
        path: a .jsonl, .json or .parquet file (optionally .gz).
        fmt: one of :data:`FORMAT_NAMES`, or None to detect it with :func:`detect_file_format`.

    Raises:
        FormatError: the file is missing or of unknown type, ``fmt`` is unknown, or the format cannot be detected.
    """
    if fmt is not None and fmt not in PARSERS:
        raise FormatError(f"unknown format {fmt!r}; known formats: {', '.join(FORMAT_NAMES)}")
    parser = PARSERS[fmt or detect_file_format(path)]
    for where, obj in decode(path):
        yield obj if isinstance(obj, InvalidRecord) else parser(obj, where)
