"""Masked vs unmasked losses differ exactly where the retrieved observations are.

Real rollouts (the tiny model forced through scripted search-then-answer turns, a real BM25 retriever), collated and
given GRPO advantages the way the trainer does (``steps.compute_advantages``), then the actor objective the workers
optimise (``workers.actor_rollout_ref.actor_loss``) is differentiated with respect to each token's log-prob. With
``algorithm.mask_observations=true`` only sampled tokens get a gradient; with ``false`` (Search-R1's ablation) the
retrieved tokens get one too; the positions that differ decode exactly to the inserted ``<information>`` blocks.

Run: python -m pytest tests/search_rl/trainer/test_observation_masking.py -q
"""

from __future__ import annotations

import pytest
import torch

from search_rl.batches import BatchMeta, PromptBatch
from search_rl.config import AlgorithmConfig, RetrieverClientConfig, RolloutConfig
from search_rl.rollout.backends import RetrieverClient
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.trainer.steps import build_train_batch, compute_advantages, place_scores
from search_rl.workers.actor_rollout_ref import actor_loss

pytestmark = pytest.mark.integration

SCRIPTS = [
    ["<think>Need it.</think><search> Deadpool 2 release </search>", "<answer> May 2018 </answer>"],
    ["<search> Nobel Prize in Physics first </search>", "<think>ok</think><answer> Röntgen </answer>"],
]


def _token_gradients(batch, mask_observations: bool) -> tuple[torch.Tensor, torch.Tensor]:
    algo = AlgorithmConfig(adv_estimator="grpo", mask_observations=mask_observations, use_kl_loss=False)
    batch, _ = compute_advantages(batch, algo, kl_ctrl=None)
    logprobs = batch.old_logprobs.clone().requires_grad_(True)
    loss, _ = actor_loss(batch, logprobs, None, algo)
    loss.backward()
    return logprobs.grad, batch.loss_mask


def test_unmasked_loss_differs_exactly_at_observation_tokens(
    tokenizer, retriever_url, make_scripted_engine, make_prompt
):
    prompts_ids = [make_prompt("When was Deadpool 2 released?"), make_prompt("Who won the first Nobel Prize?")]
    engine = make_scripted_engine({tuple(p): s for p, s in zip(prompts_ids, SCRIPTS, strict=True)})
    manager = LLMGenerationManager(
        engine,
        tokenizer,
        RetrieverClient(RetrieverClientConfig(url=retriever_url, topk=2)),
        RolloutConfig(search_turns=2, max_turn_tokens=48, max_obs_tokens=160),
    )
    trajectories = manager.generate(prompts_ids, seed=0).trajectories
    assert all(t.num_searches == 1 for t in trajectories)
    prompts = PromptBatch(
        tuple(map(tuple, prompts_ids)), ("g", "g"), ("nq", "nq"), (("a",), ("b",)), ("q1", "q2"), (0, 1)
    )
    batch = build_train_batch(trajectories, prompts, tokenizer.pad_token_id, 256, BatchMeta())
    batch = batch.replace(token_level_scores=place_scores(batch, [1.0, 0.0]), old_logprobs=batch.rollout_logprobs)

    masked_grad, masked_mask = _token_gradients(batch, mask_observations=True)
    unmasked_grad, unmasked_mask = _token_gradients(batch, mask_observations=False)
    assert torch.equal(masked_mask, batch.response_mask)
    assert torch.equal((masked_grad != 0).long(), batch.response_mask)  # sampled tokens only
    assert torch.equal((unmasked_grad != 0).long(), batch.response_attention_mask)  # every real response token

    differ = (masked_grad != 0) != (unmasked_grad != 0)  # (B, T)
    observation = batch.response_attention_mask.bool() & ~batch.response_mask.bool()
    assert torch.equal(differ, observation) and observation.any()
    for row, traj in enumerate(trajectories):
        ids = batch.response_ids[row][differ[row]].tolist()
        inserted = "".join(s.text for s in traj.segments if s.kind == "observation")
        assert tokenizer.decode(ids) == inserted
        assert inserted.count("<information>") == 1 and "Doc 1(Title:" in inserted
