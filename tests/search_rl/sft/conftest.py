"""Fixtures of the warm-start tests: a small SFT parquet built from real training rows and a real retriever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from search_rl.config import RetrieverClientConfig
from search_rl.prompt_data import REPO_ROOT
from search_rl.rollout.backends import RetrieverClient
from search_rl.sft.trajectories import contains_answer

TRAIN = REPO_ROOT / "data/datasets/nq_hotpotqa_mini/train.parquet"


def turns_for(question: str, passages: list[dict[str, str]], answer: str) -> list[dict[str, object]]:
    """One search with the question, then an answer: a warm-start ``trajectory`` value."""
    return [
        {"text": f"<think> I need to look this up. </think>\n<search> {question} </search>", "passages": passages},
        {"text": f"<think> The passages say it. </think>\n<answer> {answer} </answer>", "passages": []},
    ]


@pytest.fixture(scope="session")
def sft_parquet(retriever_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight real training rows with one-search trajectories whose passages come from the real BM25 retriever: the
    first eight whose gold answer is near the start of their top passage (``data_prep.synth_sft`` keeps only rows
    whose answer is retrieved; near the start, so that no test budget cuts it out of the observation)."""
    frame = pd.read_parquet(TRAIN).head(60).reset_index(drop=True)
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2))
    hits = asyncio.run(client.search(list(frame["question"]), 2))
    keep, trajectories = [], []
    for i, (q, ps, rm) in enumerate(zip(frame["question"], hits, frame["reward_model"], strict=True)):
        gold = next(
            (str(g) for g in rm["ground_truth"]["target"] if ps and contains_answer(ps[0].text[:300], str(g))), None
        )
        if gold is not None and len(keep) < 8:
            keep.append(i)
            trajectories.append(turns_for(q, [{"id": p.id, "title": p.title, "text": p.text} for p in ps], gold))
    assert len(keep) == 8, "the first 60 training rows should hold 8 answerable by BM25"
    frame = frame.iloc[keep].reset_index(drop=True)
    frame["trajectory"] = trajectories
    path = tmp_path_factory.mktemp("sft") / "sft.parquet"
    frame.to_parquet(path)
    return path
