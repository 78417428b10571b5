"""Warm-start examples: the same tokens and mask as a rollout, validation of the ``trajectory`` column, budgets.

The key property: ``build_trajectory`` on a row's turns gives exactly the response ids and mask that the rollout
loop (``LLMGenerationManager``) produces when the model writes those turns against the same retriever, so SFT trains
on RL's own layout and the loss mask keeps retrieved tokens out just as RL does.

Run: python -m pytest tests/search_rl/sft/test_sft_data.py -q
"""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest
import torch

from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.rollout.observations import ObservationBuilder
from search_rl.sft.dataset import SFTDataset
from search_rl.sft.trajectories import SFTTurn, SkipExample, build_trajectory, parse_turns

pytestmark = pytest.mark.integration

TURNS = [
    "<think>I need the film.</think><search> Deadpool 2 release </search>",
    "<think>And the prize.</think><search> Nobel Prize in Physics </search>",
    "<think>Done.</think><answer> May 18, 2018 </answer>",
]


def _rollout_cfg(**overrides) -> RolloutConfig:
    return RolloutConfig(**({"search_turns": 3, "max_turn_tokens": 64, "max_obs_tokens": 200} | overrides))


def test_same_tokens_and_mask_as_the_rollout(tokenizer, retriever_url, make_scripted_engine, make_prompt):
    prompt = make_prompt("When was Deadpool 2 released?")
    cfg = _rollout_cfg()
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2))
    engine = make_scripted_engine({tuple(prompt): TURNS})
    rolled = LLMGenerationManager(engine, tokenizer, client, cfg).generate([prompt], seed=0).trajectories[0]

    hits = asyncio.run(client.search(["Deadpool 2 release", "Nobel Prize in Physics"]))
    turns = [SFTTurn(TURNS[0], tuple(hits[0])), SFTTurn(TURNS[1], tuple(hits[1])), SFTTurn(TURNS[2])]
    built = build_trajectory(prompt, turns, tokenizer, ObservationBuilder(tokenizer), cfg)

    assert torch.equal(built.prompt_ids, rolled.prompt_ids)
    assert torch.equal(built.response_ids, rolled.response_ids)
    assert torch.equal(built.response_mask, rolled.response_mask)
    assert [(s.kind, s.start, s.end, s.text) for s in built.segments] == [
        (s.kind, s.start, s.end, s.text) for s in rolled.segments
    ]
    assert (built.final_answer, built.num_searches, built.stats.turns) == ("May 18, 2018", 2, 3)


def test_observation_budget_applies_as_in_rollout(tokenizer, retriever_url, make_prompt):
    client = RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=3))
    hits = asyncio.run(client.search(["Nobel Prize in Physics"]))[0]
    turns = [
        SFTTurn("<search> Nobel Prize in Physics </search>", tuple(hits)),
        SFTTurn("<answer> Nobel Prize </answer>"),
    ]
    built = build_trajectory(
        make_prompt("q"), turns, tokenizer, ObservationBuilder(tokenizer), _rollout_cfg(max_obs_tokens=60)
    )
    obs = built.response_mask == 0
    assert int(obs.sum()) <= 60 and built.stats.obs_tokens_truncated > 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "non-empty list"),
        ([], "non-empty list"),
        (
            [{"text": "<answer> a </answer>", "passages": []}, {"text": "<answer> b </answer>"}],
            "turn 0 should be a search",
        ),
        ([{"text": "<search> q </search>", "passages": []}], "turn 0 should be a answer"),
        ([{"text": "<answer> a </answer>", "passages": [{"id": "1", "title": "t", "text": "x"}]}], "has passages"),
        ([{"text": "<search> q </search>", "passages": [{"id": 1}]}, {"text": "<answer> a </answer>"}], "passage 0"),
        ([{"text": "<search> q </search><answer> a </answer>"}, {"text": "<answer> a </answer>"}], "tag protocol"),
        ([{"content": "x"}], "string `text`"),
    ],
)
def test_malformed_trajectories_name_the_row(raw, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_turns(raw, "f.parquet row 7")
    assert "f.parquet row 7" in str(e.value)


def test_budgets_raise_skip_with_a_reason(tokenizer, make_prompt):
    obs = ObservationBuilder(tokenizer)
    search = SFTTurn("<search> q </search>", ())
    answer = SFTTurn("<answer> a </answer>")
    prompt = make_prompt("q")
    cases = [
        ("too_many_searches", [search, search, answer], _rollout_cfg(search_turns=1)),
        ("turn_too_long", [SFTTurn("<think>" + "very " * 80 + "</think><answer> a </answer>")], _rollout_cfg()),
        ("prompt_too_long", [answer], _rollout_cfg(max_prompt_tokens=8, max_response_tokens=64)),
        ("response_too_long", [search, answer], _rollout_cfg(max_response_tokens=12, max_turn_tokens=10)),
    ]
    for reason, turns, cfg in cases:
        with pytest.raises(SkipExample) as e:
            build_trajectory(prompt, turns, tokenizer, obs, cfg)
        assert e.value.reason == reason


def test_dataset_batches_carry_the_rl_loss_mask(tokenizer, sft_parquet):
    data = SFTDataset([str(sft_parquet)], tokenizer, _rollout_cfg(max_obs_tokens=256, max_response_tokens=512))
    assert len(data) == 8 and not data.skipped
    batch = data.batch([0, 3, 5])
    assert batch.loss_mask is not None and torch.equal(batch.loss_mask, batch.response_mask)
    assert int((batch.response_attention_mask - batch.response_mask).sum()) > 0, "observations are present"
    unmasked = SFTDataset(
        [str(sft_parquet)], tokenizer, _rollout_cfg(max_obs_tokens=256, max_response_tokens=512), False
    )
    b2 = unmasked.batch([0, 3, 5])
    assert torch.equal(b2.loss_mask, b2.response_attention_mask)
    stats = data.stats()
    assert stats["data/sft_examples"] == 8 and stats["data/sft_searches_mean"] == 1


def test_examples_over_budget_are_counted_not_lost_silently(tokenizer, sft_parquet):
    roomy = SFTDataset([str(sft_parquet)], tokenizer, _rollout_cfg(max_obs_tokens=256, max_response_tokens=512))
    lengths = sorted(int(t.response_ids.shape[0]) for t in roomy.trajectories)
    cfg = _rollout_cfg(max_obs_tokens=256, max_response_tokens=lengths[3])
    data = SFTDataset([str(sft_parquet)], tokenizer, cfg)
    assert len(data) == sum(n <= lengths[3] for n in lengths) and data.skipped["response_too_long"] == 8 - len(data)
    with pytest.raises(ValueError, match="response_too_long"):
        SFTDataset([str(sft_parquet)], tokenizer, cfg, skip_overlong=False)


def test_a_file_without_trajectories_is_a_clear_error(tokenizer, sft_parquet, tmp_path):
    plain = tmp_path / "plain.parquet"
    pd.read_parquet(sft_parquet).drop(columns=["trajectory"]).to_parquet(plain)
    with pytest.raises(ValueError, match="no `trajectory` column.*synth_sft"):
        SFTDataset([str(plain)], tokenizer, _rollout_cfg())
