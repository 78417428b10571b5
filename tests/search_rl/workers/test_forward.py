"""Forward passes over real rollout batches: log-probs of only the loss tokens (``only``) equal the full pass's
there, are 0 elsewhere, and give the same gradient; their logits are the only ones computed where transformers accepts
a boolean ``logits_to_keep``, and the fallback for older releases gives the same values (both paths run everywhere).

Run: python -m pytest tests/search_rl/workers/test_forward.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close
from worker_factory import GradientTerms, assert_terms_cover, gradient_terms, logprob_terms, response_logprob_scale

from search_rl.models import build_tiny_model
from search_rl.workers import forward
from search_rl.workers.forward import response_logprobs


def _masked_loss_and_grads(model, batch, only):
    """(log-probs, entropies, gradients, the gradients' ``GradientTerms`` sums) of a masked token-mean loss."""
    model.zero_grad(set_to_none=True)
    terms = GradientTerms(model)
    logprobs, entropy = response_logprobs(model, batch, 0.7, with_entropy=True, entropy_grad=True, only=only)
    mask = batch.response_mask.float()
    loss = -((logprobs + 0.01 * entropy) * mask).sum() / mask.sum()
    loss.backward()
    terms.remove()
    return logprobs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()], terms.take()


@pytest.mark.parametrize("mask_supported", [True, False], ids=["boolean-logits_to_keep", "older-transformers"])
def test_only_the_loss_tokens_are_computed_and_nothing_changes_for_the_loss(
    rollout_batch, tokenizer, monkeypatch, mask_supported
):
    if mask_supported and not forward.LOGITS_MASK_SUPPORTED:
        mask_supported = False  # this transformers cannot take the mask: its fallback is what runs
    monkeypatch.setattr(forward, "LOGITS_MASK_SUPPORTED", mask_supported)
    model = build_tiny_model(tokenizer, seed=3)
    mask = rollout_batch.response_mask.bool()
    assert (~mask & rollout_batch.response_attention_mask.bool()).any(), "the rollout should contain observations"
    full_lp, full_ent, full_grads, terms = _masked_loss_and_grads(model, rollout_batch, None)
    assert_terms_cover(full_grads, terms)
    lp, ent, grads, _ = _masked_loss_and_grads(model, rollout_batch, rollout_batch.response_mask)
    # the output head multiplies fewer rows, which a kernel may block and sum otherwise (numerics.py)
    n = logprob_terms(rollout_batch)
    assert_reordered_close(lp[mask], full_lp[mask], n, scale=response_logprob_scale(model, rollout_batch, 0.7))
    entropy_scale = response_logprob_scale(model, rollout_batch, 0.7, entropy=True)
    assert_reordered_close(ent[mask], full_ent[mask], n, scale=entropy_scale)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert (full_lp[~mask & rollout_batch.response_attention_mask.bool()] != 0).any()
    for a, b, t in zip(grads, full_grads, terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(rollout_batch), scale=t)

    shapes: list[tuple[int, ...]] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape)))
    with torch.no_grad():
        response_logprobs(model, rollout_batch, 1.0, only=rollout_batch.response_mask)
    hook.remove()
    if mask_supported:
        assert shapes == [(int(mask.sum()), model.config.vocab_size)], "one vocabulary row per loss token, no more"
    else:
        t = int(rollout_batch.response_attention_mask.sum(-1).max())
        assert shapes == [(len(mask), t + 1, model.config.vocab_size)], "the last t + 1 positions, as without a mask"
