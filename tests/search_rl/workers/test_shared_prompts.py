"""Each distinct prompt encoded once (``SharedPrompts``): the response log-probs, entropies and parameter gradients
equal those of full passes over ``prompt + response``, for any micro-batching of the batch.

Run: python -m pytest tests/search_rl/workers/test_shared_prompts.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close
from worker_factory import GradientTerms, assert_terms_cover, gradient_terms, logprob_terms, response_logprob_scale

from search_rl.models import build_tiny_model
from search_rl.workers.forward import response_logprobs
from search_rl.workers.optimization import shuffled_order
from search_rl.workers.shared_prompts import SharedPrompts, prompt_keys


def _loss(logprobs, entropy, micro):
    mask = micro.response_mask.float()
    return -((logprobs + 0.01 * entropy) * mask).sum()


def _full(model, batch, micro_size):
    """(log-probs, gradients, the gradients' ``GradientTerms`` sums): each sample's prompt is its own terms."""
    model.zero_grad(set_to_none=True)
    terms = GradientTerms(model)
    lps = []
    for micro in batch.split_by_size(micro_size):
        lp, ent = response_logprobs(model, micro, 0.7, with_entropy=True, entropy_grad=True, only=micro.response_mask)
        _loss(lp, ent, micro).backward()
        lps.append(lp.detach())
    terms.remove()
    return torch.cat(lps), [p.grad.clone() for p in model.parameters()], terms.take()


def _shared(model, batch, micro_size):
    model.zero_grad(set_to_none=True)
    shared = SharedPrompts(model, batch, grad=True)
    lps = []
    for micro in batch.split_by_size(micro_size):
        lp, ent = response_logprobs(
            model, micro, 0.7, with_entropy=True, entropy_grad=True, only=micro.response_mask, shared=shared
        )
        _loss(lp, ent, micro).backward()
        lps.append(lp.detach())
    shared.backward()
    return torch.cat(lps), [p.grad.clone() for p in model.parameters()], shared


@pytest.mark.parametrize("micro_size", [1, 3])
def test_shared_prompts_give_the_full_passes_log_probs_and_gradients(rollout_batch, tokenizer, micro_size):
    model = build_tiny_model(tokenizer, seed=4)
    # rows in an order that interleaves the groups, so micro-batches mix prompts and split groups
    batch = rollout_batch.select(torch.tensor([0, 2, 4, 6, 1, 3, 5, 7]))
    full_lp, full_grads, terms = _full(model, batch, micro_size)
    assert_terms_cover(full_grads, terms)
    lp, grads, shared = _shared(model, batch, micro_size)
    # a prompt read from the shared cache is attended in other blocks than in a full pass (numerics.py)
    assert_reordered_close(lp, full_lp, logprob_terms(batch), scale=response_logprob_scale(model, batch, 0.7))
    for a, b, t in zip(grads, full_grads, terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(batch), scale=t)
    keys = prompt_keys(batch)
    assert shared.distinct == len(set(keys)) == 4
    assert shared.saved_tokens == sum(len(k) - 1 for k in keys[4:])  # the second copy of each prompt


def test_shared_prompts_without_gradient(rollout_batch, tokenizer):
    model = build_tiny_model(tokenizer, seed=5)
    with torch.no_grad():
        full, _ = response_logprobs(model, rollout_batch, 1.0)
        shared = SharedPrompts(model, rollout_batch, grad=False)
        lp, _ = response_logprobs(model, rollout_batch, 1.0, shared=shared)
        shared.backward()  # nothing to send: a no-op
    real = rollout_batch.response_attention_mask.bool()
    scale = response_logprob_scale(model, rollout_batch)
    assert_reordered_close(lp[real], full[real], logprob_terms(rollout_batch), scale=scale)
    assert (lp[~real] == 0).all()


def test_a_row_from_another_batch_is_refused(rollout_batch, tokenizer):
    model = build_tiny_model(tokenizer, seed=5)
    with torch.no_grad():
        shared = SharedPrompts(model, rollout_batch.select(torch.tensor([0, 1])), grad=False)
        with pytest.raises(KeyError, match=r"rows \[0\] have a prompt that is not in the batch"):
            response_logprobs(model, rollout_batch.select(torch.tensor([2])), 1.0, shared=shared)


def test_group_shuffle_keeps_each_group_whole_and_still_shuffles():
    uids = tuple(u for u in "abcdefgh" for _ in range(4))  # 8 groups of 4, adjacent
    orders = [shuffled_order(uids, torch.Generator().manual_seed(s), keep_groups=True).tolist() for s in range(5)]
    for order in orders:
        assert sorted(order) == list(range(32))
        picked = [uids[i] for i in order]
        for start in range(0, 32, 4):  # any mini-batch of a multiple of 4 holds complete groups
            assert len(set(picked[start : start + 4])) == 1
        assert [i % 4 for i in order] == [0, 1, 2, 3] * 8  # rows keep their order inside a group
    assert len({tuple(o) for o in orders}) > 1
    single = shuffled_order(uids, torch.Generator().manual_seed(0), keep_groups=False).tolist()
    assert sorted(single) == list(range(32))
    assert any(len({uids[i] for i in single[s : s + 4]}) > 1 for s in range(0, 32, 4))
