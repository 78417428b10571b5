"""Row adapters: records of the TriviaQA and PopQA formats reshaped into FlashRAG's
``{"id", "question", "golden_answers"}``, which ``data_prep.formats.parse_flashrag`` validates (so every format
reports a bad record the same way). A field that cannot be read becomes None, which the parser names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def triviaqa_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """TriviaQA's HF rows (``question``, ``question_id``, ``answer: {value, aliases}``) or the official JSON's records
    (``Question``, ``QuestionId``, ``Answer: {Value, Aliases}``); the value comes first, then its aliases.

    >>> triviaqa_row({"Question": "Capital of France?", "QuestionId": "tc_1", "Answer": {"Value": "Paris",
    ...     "Aliases": ["Paris", "Paree"]}})
    {'id': 'tc_1', 'question': 'Capital of France?', 'golden_answers': ['Paris', 'Paris', 'Paree']}
    """
    answer = row.get("answer", row.get("Answer"))
    golds = None
    if isinstance(answer, Mapping):
        golds = [answer.get("value", answer.get("Value")), *(answer.get("aliases", answer.get("Aliases")) or [])]
    question = row.get("question", row.get("Question"))
    return {"id": row.get("question_id", row.get("QuestionId")), "question": question, "golden_answers": golds}


def popqa_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """PopQA's records (``id``, ``question``, ``possible_answers``: a list, or the HF parquet's JSON-encoded list).

    >>> popqa_row({"id": 7, "question": "Who wrote Dune?", "possible_answers": '["Frank Herbert", "Herbert"]'})
    {'id': 7, 'question': 'Who wrote Dune?', 'golden_answers': ['Frank Herbert', 'Herbert']}
    """
    answers = row.get("possible_answers")
    if isinstance(answers, str):
        try:
            answers = json.loads(answers)
        except json.JSONDecodeError:
            answers = None
    return {"id": row.get("id"), "question": row.get("question"), "golden_answers": answers}
