"""Rollout dumps: every trajectory of a step as one JSON line, complete enough for a viewer to render it.

Files: ``<run>/rollouts/train_step_000003.jsonl`` and ``val_step_000005.jsonl`` (``main_eval`` writes the same
records to ``trajectories.jsonl``). One record per trajectory:

=================== =====================================================================================
``step``, ``kind``  training step; ``train``, ``val`` or ``eval``
``uid``, ``sample`` the prompt's global id and the sample's index within its group (0 .. n-1)
``data_source``     the row's source; ``row_index`` its position in the parquet file
``question``        the bare question; ``gold``: the gold answers
``prompt``          the prompt as the model saw it (chat template applied), decoded
``response``        the whole response, decoded (model turns and inserted observations)
``segments``        ``[{"kind": "model"|"observation", "start", "end", "text"}]``: token spans of the response
``mask_spans``      ``[[start, end], ...]``: the token spans where ``response_mask`` is 1 (what the losses see)
``answer``          the extracted ``<answer>`` (null if none); ``stop_reason``: answer, max_turns, max_response_tokens
``reward``          the scalar reward; ``reward_components``: em, subem, f1, format, answered
``advantage``       mean advantage over the sample's loss tokens (training only, else null)
``stats``           turns, searches, search attempts, valid/invalid actions, truncations, retriever errors
``search_calls``    ``[{"query", "passage_ids", "failed", "retrieval_key"}]``: each query sent, the ids of the passages
                    shown for it, and its entry in the run's retrieval recording (null when not recorded;
                    ``python -m search_rl.tools.recordings show FILE KEY``); a call of another tool adds ``"tool"``
                    (its name; absent means ``search``, so records of search-only runs are unchanged)
``outcome``         ``correct``, ``no_answer``, ``wrong_no_search``, ``retrieval_missed`` or ``read_wrong``;
                    ``gold_retrieved``: a gold answer was in a passage shown (``search_rl.reward.search_stats``);
                    ``answer_source`` (read wrong only, else null): ``gold_passage``, ``other_passage``, ``not_shown``
``response_tokens`` / ``model_tokens``: lengths; ``weight_version``: the policy version that sampled it
=================== =====================================================================================
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from search_rl.batches import PromptBatch
from search_rl.datatypes import RewardResult, Trajectory
from search_rl.reward.search_stats import diagnose


def mask_spans(mask: torch.Tensor) -> list[list[int]]:
    """``[start, end)`` runs of ones in a 1-D mask.

    >>> mask_spans(torch.tensor([1, 1, 0, 0, 1, 0]))
    [[0, 2], [4, 5]]
    """
    spans: list[list[int]] = []
    start = None
    for i, m in enumerate(mask.tolist()):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append([start, i])
            start = None
    if start is not None:
        spans.append([start, len(mask)])
    return spans


def trajectory_record(
    traj: Trajectory,
    result: RewardResult,
    prompts: PromptBatch,
    i: int,
    tokenizer: PreTrainedTokenizerBase,
    *,
    step: int,
    kind: str,
    sample: int = 0,
    advantage: float | None = None,
    weight_version: int = 0,
) -> dict[str, Any]:
    """The JSON record of sample ``i`` (see the module docstring)."""

    def decode(ids: torch.Tensor) -> str:
        return str(tokenizer.decode(ids.tolist(), skip_special_tokens=False))

    diagnosis = diagnose(traj, prompts.targets[i], result)
    return {
        "step": step,
        "kind": kind,
        "uid": prompts.uids[i],
        "sample": sample,
        "data_source": prompts.data_sources[i],
        "row_index": prompts.row_indices[i],
        "question": prompts.questions[i],
        "gold": list(prompts.targets[i]),
        "prompt": decode(traj.prompt_ids),
        "response": decode(traj.response_ids),
        "segments": [dataclasses.asdict(s) for s in traj.segments],
        "mask_spans": mask_spans(traj.response_mask),
        "answer": traj.final_answer,
        "stop_reason": traj.stop_reason,
        "reward": result.score,
        "reward_components": dict(result.components),
        "advantage": advantage,
        "stats": dataclasses.asdict(traj.stats),
        "search_calls": [
            {
                "query": c.query,
                "passage_ids": [p.id for p in c.passages],
                "failed": c.failed,
                "retrieval_key": c.retrieval_key,
                **({"tool": c.tool} if c.tool != "search" else {}),
            }
            for c in traj.search_calls
        ],
        "outcome": diagnosis.outcome,
        "gold_retrieved": diagnosis.gold_retrieved,
        "answer_source": diagnosis.answer_source,
        "response_tokens": int(traj.response_ids.shape[0]),
        "model_tokens": int(traj.response_mask.sum()),
        "weight_version": weight_version,
    }


def sample_indices(uids: Sequence[str]) -> list[int]:
    """Each sample's index within its group (samples of a prompt are adjacent or not; order of appearance)."""
    seen: dict[str, int] = {}
    out = []
    for uid in uids:
        out.append(seen.get(uid, 0))
        seen[uid] = out[-1] + 1
    return out


class RolloutDumper:
    """Writes ``<directory>/<kind>_step_<step>.jsonl`` files."""

    def __init__(self, directory: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        self.directory, self.tokenizer = directory, tokenizer

    def rewind(self, step: int) -> None:
        """Delete the dumps of steps after ``step`` (a resumed or restarted run writes them again)."""
        for path in self.directory.glob("*_step_*.jsonl"):
            if int(path.stem.rsplit("_", 1)[1]) > step:
                path.unlink()

    def dump(
        self,
        kind: str,
        step: int,
        prompts: PromptBatch,
        trajectories: Sequence[Trajectory],
        results: Sequence[RewardResult],
        advantages: Sequence[float] | None = None,
        weight_version: int = 0,
    ) -> Path:
        """Write one file for the batch and return its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{kind}_step_{step:06d}.jsonl"
        write_records(
            path,
            prompts,
            trajectories,
            results,
            self.tokenizer,
            step=step,
            kind=kind,
            advantages=advantages,
            weight_version=weight_version,
        )
        return path


def write_records(
    path: Path,
    prompts: PromptBatch,
    trajectories: Sequence[Trajectory],
    results: Sequence[RewardResult],
    tokenizer: PreTrainedTokenizerBase,
    *,
    step: int,
    kind: str,
    advantages: Sequence[float] | None = None,
    weight_version: int = 0,
) -> None:
    """Write the records of a batch to ``path`` (replacing it)."""
    samples = sample_indices(prompts.uids)
    with path.open("w", encoding="utf-8") as f:
        for i, (traj, result) in enumerate(zip(trajectories, results, strict=True)):
            record = trajectory_record(
                traj,
                result,
                prompts,
                i,
                tokenizer,
                step=step,
                kind=kind,
                sample=samples[i],
                advantage=None if advantages is None else advantages[i],
                weight_version=weight_version,
            )
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
