"""The update and log-prob speed levers change nothing but speed and memory (float32, CPU, the tiny Llama):

- chunked log-probs (``logprob_chunk_tokens``): the same log-probs, entropies and gradients as full-vocabulary logits,
  tied or untied head, with or without the loss-token mask, at a temperature;
- token-budget micro-batches (``ppo_max_token_len_per_gpu``, ``log_prob_max_token_len_per_gpu``): the same loss,
  gradient norm and weights after one optimizer step, and the same log-probs; also on two ranks whose micro-batch
  counts differ;
- length-sorted log-prob passes (``log_prob_sort_by_length``): the same log-probs in the batch's order.

Run: python -m pytest tests/search_rl/workers/test_levers.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close, reorder_tol
from transformers import LlamaForCausalLM
from worker_factory import (
    GradientTerms,
    StepCapture,
    assert_same_adamw_step,
    assert_terms_cover,
    gradient_terms,
    logprob_terms,
    make_actor,
    response_logprob_scale,
    run_two_ranks,
    whole,
)

from search_rl.batches import TrainBatch
from search_rl.models.tiny import tiny_llama_config
from search_rl.workers import forward
from search_rl.workers.chunked_logprobs import chunked_logprobs
from search_rl.workers.forward import response_logprobs
from search_rl.workers.micro_batches import length_order, micro_batches, padded_tokens

# The levers change summation orders only (tokens summed chunk by chunk, micro-batches of other sizes), so every
# comparison below allows two orders of the sums behind a value (``numerics``): ``logprob_terms`` for log-probs and
# entropies, at the scale of the logits behind them (``response_logprob_scale``), ``gradient_terms`` for gradients, at
# the sums of their per-token terms' absolute values (``GradientTerms``: the terms cancel), and for the scalar metrics
# (means over the batch's tokens). Measured on AVX2 with 1 and 2 threads: log-probs within 1e-7 of their scale and
# gradients within 2e-6 of theirs, against bounds of about 6e-5 and 2e-4.


def _model(tokenizer, tied: bool) -> LlamaForCausalLM:
    cfg = tiny_llama_config(tokenizer, hidden_size=64, num_layers=2)
    cfg.tie_word_embeddings = tied
    torch.manual_seed(5)
    return LlamaForCausalLM(cfg)


def _values_and_grads(model, batch, only, chunk):
    """(log-probs, entropies, gradients by name, their ``GradientTerms`` sums by name)."""
    model.zero_grad(set_to_none=True)
    terms = GradientTerms(model)
    lp, ent = response_logprobs(model, batch, 0.7, with_entropy=True, entropy_grad=True, only=only, chunk_tokens=chunk)
    mask = batch.response_mask.float()
    (-((lp * 1.3 + 0.01 * ent) * mask).sum() / mask.sum()).backward()
    terms.remove()
    names = [n for n, _ in model.named_parameters()]
    sums = dict(zip(names, terms.take(), strict=True))
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, sums


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("masked", [True, False], ids=["loss-tokens", "all-tokens"])
@pytest.mark.parametrize("mask_supported", [True, False], ids=["boolean-logits_to_keep", "older-transformers"])
def test_chunked_logprobs_equal_full_vocabulary_logits(
    rollout_batch, tokenizer, monkeypatch, tied, masked, mask_supported
):
    monkeypatch.setattr(forward, "LOGITS_MASK_SUPPORTED", mask_supported and forward.LOGITS_MASK_SUPPORTED)
    model = _model(tokenizer, tied)
    only = rollout_batch.response_mask if masked else None
    plain = _values_and_grads(model, rollout_batch, only, 0)
    chunked = _values_and_grads(model, rollout_batch, only, 7)  # chunks of 7 tokens, the last one shorter
    n = logprob_terms(rollout_batch)
    assert_reordered_close(chunked[0], plain[0], n, scale=response_logprob_scale(model, rollout_batch, 0.7))
    entropy_scale = response_logprob_scale(model, rollout_batch, 0.7, entropy=True)
    assert_reordered_close(chunked[1], plain[1], n, scale=entropy_scale)
    assert plain[2].keys() == chunked[2].keys()
    assert_terms_cover(list(plain[2].values()), list(plain[3].values()))
    for name, grad in plain[2].items():
        assert_reordered_close(chunked[2][name], grad, gradient_terms(rollout_batch), scale=plain[3][name], msg=name)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_chunked_logprobs_by_hand():
    """Uniform logits over 4 tokens: log-prob -log 4, entropy log 4; the log-prob's gradient is onehot - p."""
    hidden = torch.zeros(3, 2, requires_grad=True)
    weight = torch.randn(4, 2, requires_grad=True)
    lp, ent = chunked_logprobs(hidden, weight, torch.tensor([0, 1, 3]), 1.0, 2)
    torch.testing.assert_close(lp, torch.full((3,), -torch.log(torch.tensor(4.0))))
    torch.testing.assert_close(ent, torch.full((3,), torch.log(torch.tensor(4.0))))
    lp.sum().backward()
    onehot_minus_p = torch.eye(4)[[0, 1, 3]] - 0.25  # (3, V)
    torch.testing.assert_close(hidden.grad, onehot_minus_p @ weight.detach())
    torch.testing.assert_close(weight.grad, torch.zeros(4, 2))  # hidden is zero


def test_chunked_logprobs_refuse_heads_they_cannot_reproduce(rollout_batch, tokenizer):
    model = _model(tokenizer, tied=False)
    scale = model.register_forward_hook(lambda _m, _i, out: out.__setitem__("logits", out.logits * 2.0))
    with pytest.raises(ValueError, match="changed its output head's values.*logprob_chunk_tokens=0"):
        response_logprobs(model, rollout_batch, 1.0, chunk_tokens=8)
    scale.remove()
    response_logprobs(model, rollout_batch, 1.0, chunk_tokens=8)  # the head is plain again
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with pytest.raises(ValueError, match="bias-free nn.Linear output head"):
        response_logprobs(model, rollout_batch, 1.0, chunk_tokens=8)


def test_token_budget_packs_by_padded_tokens(rollout_batch):
    batch = rollout_batch.select(torch.argsort(rollout_batch.attention_mask.sum(-1), stable=True))
    budget = 2 * padded_tokens(batch.select(torch.tensor([len(batch) - 1])))  # two of the longest row
    parts = micro_batches(batch, 3, budget)
    assert sum(len(p) for p in parts) == len(batch)
    assert all(padded_tokens(p) <= budget for p in parts)
    assert len(parts) < len(batch), "short rows share a micro-batch"
    assert [len(p) for p in micro_batches(batch, 3, 0)] == [len(p) for p in batch.split_by_size(3)]
    alone = micro_batches(batch, 3, 1)  # below every row: each alone, none dropped
    assert [len(p) for p in alone] == [1] * len(batch)


LR = 1e-2


def _one_step(batch: TrainBatch, **levers) -> tuple[dict[str, float], list[torch.Tensor], list[torch.Tensor], list]:
    """One optimizer step's metrics, the weights before and after it, and the gradients it used with their
    ``GradientTerms`` sums (``StepCapture``)."""
    worker = make_actor(micro=2, mini=4, lr=LR, **levers)
    worker.init_distributed("127.0.0.1", 0)
    trainable = worker.trainable
    before = [whole(p) for p in trainable.params]
    capture = StepCapture(worker, check=not levers)  # the levers' chunked head is not counted
    metrics = worker.update_actor(batch, step=1)
    return metrics, before, [whole(p) for p in trainable.params], capture


@pytest.mark.parametrize(
    "levers",
    [
        {"logprob_chunk_tokens": 5},
        {"ppo_max_token_len_per_gpu": 300},
        {"logprob_chunk_tokens": 16, "ppo_max_token_len_per_gpu": 10_000},
    ],
    ids=["chunked", "token-budget", "both"],
)
def test_one_update_step_is_the_same_with_the_levers(rollout_batch, levers):
    """The gradients the optimizer step used agree to their summation order, the metrics too, and the step moved
    each weight as Adam moves it for the two gradients (``assert_same_adamw_step``)."""
    batch = rollout_batch.select(torch.arange(4))  # one mini-batch: one optimizer step
    base, initial, base_params, base_step = _one_step(batch)
    fast, fast_initial, fast_params, fast_step = _one_step(batch, **levers)
    base_grads, fast_grads = base_step.grads, fast_step.grads
    n = gradient_terms(batch)
    # means over the batch's tokens of terms of size <= 1 (ratios ~1, |advantages| <= 1) or of the metric's own size
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert fast[key] == pytest.approx(base[key], rel=reorder_tol(n), abs=reorder_tol(n)), key
    assert len(fast_grads) == len(base_grads) == len(initial) > 0, "one optimizer step"
    for a, b, terms in zip(fast_grads, base_grads, base_step.terms, strict=True):
        assert_reordered_close(a, b, n, scale=terms)
    assert all(torch.equal(a, b) for a, b in zip(fast_initial, initial, strict=True)), "the same initial weights"
    assert_same_adamw_step(fast_params, base_params, fast_grads, base_grads, LR)
    moved = max(float((a - b).abs().max()) for a, b in zip(base_params, initial, strict=True))
    assert moved > LR / 2, "the step moved the weights by about lr (the comparison is not vacuous)"


@pytest.mark.parametrize(
    "levers",
    [{"log_prob_sort_by_length": True}, {"log_prob_max_token_len_per_gpu": 250}, {"logprob_chunk_tokens": 3}],
    ids=["sorted", "token-budget", "chunked"],
)
def test_log_prob_passes_are_the_same_with_the_levers(rollout_batch, levers):
    base = make_actor(log_prob_sort_by_length=False)
    base.init_distributed("127.0.0.1", 0)
    fast = make_actor(**{"log_prob_sort_by_length": False, **levers})
    fast.init_distributed("127.0.0.1", 0)
    lp, ent = fast.compute_log_prob(rollout_batch)
    base_lp, base_ent = base.compute_log_prob(rollout_batch)
    n, scale = logprob_terms(rollout_batch), response_logprob_scale(base.module, rollout_batch)
    assert_reordered_close(lp, base_lp, n, scale=scale)
    assert_reordered_close(ent, base_ent, n, scale=response_logprob_scale(base.module, rollout_batch, entropy=True))
    ref, base_ref = fast.compute_ref_log_prob(rollout_batch), base.compute_ref_log_prob(rollout_batch)
    assert_reordered_close(ref, base_ref, n, scale=scale)  # the reference starts as the policy


def _rank_step(rank: int, port: int, out: dict, batch: TrainBatch) -> None:
    worker = make_actor(micro=2, mini=4, rank=rank, world=2, logprob_chunk_tokens=5, ppo_max_token_len_per_gpu=483)
    worker.init_distributed("127.0.0.1", port)
    captured: list[torch.Tensor] = []
    trainable = worker.trainable
    trainable.optimizer.register_step_pre_hook(lambda *_: captured.extend(whole(p.grad) for p in trainable.params))
    worker.update_actor(batch.split(2)[rank], step=1)
    out[rank] = captured


@pytest.mark.slow
def test_two_ranks_with_different_micro_batch_counts_take_the_single_process_step(rollout_batch):
    """A token budget packs each rank's shard its own way (here 3 and 4 passes): the rank with fewer repeats its last
    pass with weight 0, and the gradient is the one process's without levers."""
    budget = 483
    counts = [len(micro_batches(s.select(length_order(s)), 2, budget)) for s in rollout_batch.split(2)]
    assert counts[0] != counts[1], f"the shards should pack into different pass counts, got {counts}"
    single = make_actor(micro=2, mini=4)
    single.init_distributed("127.0.0.1", 0)
    expected = StepCapture(single)
    single.update_actor(rollout_batch, step=1)
    ranks = run_two_ranks(_rank_step, rollout_batch)
    assert len(ranks[0]) == len(ranks[1]) == len(expected.grads) > 0
    for a, b, ref, terms in zip(ranks[0], ranks[1], expected.grads, expected.terms, strict=True):
        assert torch.equal(a, b), "both ranks gather the same reduced gradient"
        assert_reordered_close(a, ref, gradient_terms(rollout_batch), scale=terms)
