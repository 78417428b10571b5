"""The default rollout, pinned: with default settings (Search-R1 tags, the search tool only) the agent loop's output —
response ids, masks, segments, counters, search calls, rewards and the dumped records — hashes to the value the loop
produced before the tool seam existed (``search_rl/rollout/tools/``). A change to any token, mask bit, counter or
record field of the default path changes the hash.

The scenario covers every kind of turn: searches, an invalid action whose feedback no longer fits, an empty query
(feedback), a failed batch of searches observed as errors, observations cut to the budget, a final turn with search
off, and episodes ended by the response budget. The model is the tiny random Llama forced through scripted turns
(``ScriptedLogits``), sampling with a fixed seed; the backend is the in-memory retriever over the shipped corpus.
Log-probs are left out of the hash (they are the engine's floats, copied through untouched); everything else is
exact.

Run: python -m pytest tests/search_rl/rollout/test_default_rollout_pin.py -q
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from memory_retriever import InMemoryRetriever, shipped_passages

from search_rl.batches import PromptBatch
from search_rl.config import RolloutConfig
from search_rl.datatypes import GroundTruth
from search_rl.reward import compute_reward
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.tracking.rollout_dump import trajectory_record

SCRIPTS = {
    "When was Deadpool 2 released?": [
        "<think>I need the film.</think><search> Deadpool 2 release </search>",
        "I will just talk.",
        "<think>Done.</think><answer> May 18, 2018 </answer>",
    ],
    "Who won the first Nobel Prize in Physics?": [
        "<search>   </search>",
        "<search> broken query </search>",
        "<answer> Röntgen </answer>",
    ],
    "Where is Nigeria?": ["<search> Deadpool </search>"] * 6,
    "Long answer?": ["<think>The list is long, so I search it.</think><search> Nobel Prize in Physics </search>"] * 6,
}
GOLD = {
    "When was Deadpool 2 released?": ("May 18, 2018",),
    "Who won the first Nobel Prize in Physics?": ("Wilhelm Conrad Röntgen",),
    "Where is Nigeria?": ("West Africa",),
    "Long answer?": ("1901",),
}
PINNED = {
    "turns": "df995ee95b8d0ba454a30fb5a7c8b42565a18e8d2f3ab7d4cfcc1d36675f2ff4",
    "continuous": "848f56aa51cc5fee6244a7062737bcd7ef381521da9e690155a33b01084808eb",
}
"""sha256 of the scenario's output per schedule, computed with the loop before the tool seam (commit d611f8d)."""
CALL_FIELDS = ("query", "passages", "failed", "retrieval_key")
"""The fields a ``SearchCall`` had before the seam (the hash covers them; the ``tool`` field is checked apart)."""
STOPS = {
    "turns": ["max_response_tokens", "answer", "max_turns", "max_response_tokens"],
    "continuous": ["max_response_tokens", "answer", "max_response_tokens", "max_response_tokens"],
}
"""How each episode ended (the continuous schedule searches each sample as it stops, so one failing query fails
only its own batch)."""


def _digest(result, prompts: list[list[int]], tokenizer) -> tuple[str, list[dict]]:
    questions = list(SCRIPTS)
    batch = PromptBatch(
        prompt_ids=tuple(tuple(p) for p in prompts),
        uids=tuple(f"u{i}" for i in range(len(prompts))),
        data_sources=("nq",) * len(prompts),
        targets=tuple(GOLD[q] for q in questions),
        questions=tuple(questions),
        row_indices=tuple(range(len(prompts))),
    )
    out = []
    for i, traj in enumerate(result.trajectories):
        calls = traj.search_calls
        assert all(c.tool == "search" for c in calls)
        reward = compute_reward(traj, GroundTruth(batch.targets[i], batch.data_sources[i]))
        record = trajectory_record(traj, reward, batch, i, tokenizer, step=0, kind="eval")
        assert all("tool" not in c for c in record["search_calls"]), "search-only records keep their old form"
        out.append(
            {
                "response_ids": traj.response_ids.tolist(),
                "response_mask": traj.response_mask.tolist(),
                "prompt_ids": traj.prompt_ids.tolist(),
                "search_calls": [{k: asdict[k] for k in CALL_FIELDS} for asdict in map(dataclasses.asdict, calls)],
                "record": record,
            }
        )
    blob = json.dumps(out, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest(), out


@pytest.mark.parametrize("schedule", ["turns", "continuous"])
def test_the_default_rollout_is_unchanged(schedule, tokenizer, make_scripted_hf, make_prompt):
    prompts = [make_prompt(q) for q in SCRIPTS]
    engine = make_scripted_hf({tuple(p): s for p, s in zip(prompts, SCRIPTS.values(), strict=True)})
    retriever = InMemoryRetriever(shipped_passages(), topk=3, failing=["broken query"])
    cfg = RolloutConfig(
        search_turns=2,
        max_turn_tokens=48,
        max_obs_tokens=96,
        max_response_tokens=170,
        on_retriever_error="observe",
        schedule=schedule,
        seed=7,
    )
    result = LLMGenerationManager(engine, tokenizer, retriever, cfg).generate(prompts)
    digest, out = _digest(result, prompts, tokenizer)
    stops = [r["record"]["stop_reason"] for r in out]
    assert stops == STOPS[schedule]
    assert digest == PINNED[schedule], json.dumps(out, ensure_ascii=False)[:2000]
