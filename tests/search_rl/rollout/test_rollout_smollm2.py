"""SmolLM2-135M-Instruct rolled out over shipped test questions against a real retriever server (slow).

The model is not trained to search, so the assertions are about the machinery, not the answers: every trajectory
is token-exact (mask==1 ids are the sampled ids, mask==0 runs decode to the inserted observations), ends for a
known reason within its budgets, and is scored by the QA reward.

Run: python -m pytest tests/search_rl/rollout/test_rollout_smollm2.py -q -m slow
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.datatypes import GroundTruth
from search_rl.models import load_model
from search_rl.prompt_data import encode_prompt
from search_rl.reward import compute_reward
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.generation_manager import LLMGenerationManager

pytestmark = [pytest.mark.slow, pytest.mark.integration]
logger = logging.getLogger(__name__)

TEST_SPLIT = Path(__file__).resolve().parents[3] / "data" / "datasets" / "nq_hotpotqa_mini" / "test.parquet"


def _rows(n: int) -> pd.DataFrame:
    df = pd.read_parquet(TEST_SPLIT)
    return pd.concat([df[df.data_source == "nq"].head(n // 2), df[df.data_source == "hotpotqa"].head(n - n // 2)])


def test_smollm2_rollout_is_token_exact(tokenizer, retriever_url, recording):
    rows = _rows(4)
    prompts = [encode_prompt(tokenizer, list(p)) for p in rows.prompt]
    engine = recording(HFEngine(load_model(), tokenizer))
    cfg = RolloutConfig(
        search_turns=2, max_turn_tokens=48, max_obs_tokens=160, max_response_tokens=320, temperature=1.0
    )
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2))
    result = LLMGenerationManager(engine, tokenizer, client, cfg).generate(prompts, seed=1)

    for i, traj in enumerate(result.trajectories):
        sampled = []
        for call_prompts, _, outs in engine.calls:
            context = prompts[i] + traj.response_ids.tolist()
            for p, g in zip(call_prompts, outs, strict=True):
                if context[: len(p)] == p and p[: len(prompts[i])] == prompts[i]:
                    sampled += g.token_ids
        assert traj.response_ids[traj.response_mask == 1].tolist() == sampled
        for seg in traj.segments:
            ids = traj.response_ids[seg.start : seg.end].tolist()
            assert tokenizer.decode(ids) == seg.text
            assert set(traj.response_mask[seg.start : seg.end].tolist()) == {int(seg.kind == "model")}
        assert len(traj.response_ids) <= cfg.max_response_tokens
        assert traj.stop_reason in ("answer", "max_turns", "max_response_tokens")
        assert traj.stats.turns <= cfg.search_turns + 1
        row = rows.iloc[i]
        reward = compute_reward(traj, GroundTruth(tuple(row.reward_model["ground_truth"]["target"]), row.data_source))
        assert 0.0 <= reward.score <= 1.0
        logger.info("sample %d: stop=%s searches=%d reward=%.1f", i, traj.stop_reason, traj.num_searches, reward.score)
    assert result.metrics["rollout/turns_mean"] >= 1.0
