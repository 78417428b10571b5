"""Fixtures of the warm-start tests: a small SFT parquet built from real training rows and a real retriever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from search_rl.agent.retriever_client import RetrieverClient
from search_rl.config import RetrieverClientConfig
from search_rl.data import REPO_ROOT

TRAIN = REPO_ROOT / "data/datasets/nq_hotpotqa_mini/train.parquet"


def turns_for(question: str, passages: list[dict[str, str]], answer: str) -> list[dict[str, object]]:
    """One search with the question, then an answer: a warm-start ``trajectory`` value."""
    return [
        {"text": f"<think> I need to look this up. </think>\n<search> {question} </search>", "passages": passages},
        {"text": f"<think> The passages say it. </think>\n<answer> {answer} </answer>", "passages": []},
    ]


@pytest.fixture(scope="session")
def sft_parquet(retriever_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight real training rows with one-search trajectories whose passages come from the real BM25 retriever."""
    frame = pd.read_parquet(TRAIN).head(8).reset_index(drop=True)
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2))
    hits = asyncio.run(client.search(list(frame["question"]), 2))
    frame["trajectory"] = [
        turns_for(q, [{"id": p.id, "title": p.title, "text": p.text} for p in ps], str(rm["ground_truth"]["target"][0]))
        for q, ps, rm in zip(frame["question"], hits, frame["reward_model"], strict=True)
    ]
    path = tmp_path_factory.mktemp("sft") / "sft.parquet"
    frame.to_parquet(path)
    return path
