"""Actor and critic workers in-process (world size 1, no Ray): log-prob alignment, update invariances, checkpoints.

- Log-probs recomputed by the actor equal the engine's sampling log-probs on every model token: the forward pass
  (trimmed micro-batches, ``logits_to_keep``) is aligned with the rollout token for token.
- Gradient accumulation is exact: micro-batches of 1 and of 4 give the same gradient (token-mean weighting).
- Data parallelism is exact: two gloo ranks with half the batch each give the single-process gradient.
- A checkpoint restores the actor, the critic and their optimizers exactly.

Run: python -m pytest tests/search_rl/workers/test_workers_local.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close, reorder_tol
from worker_factory import (
    StepCapture,
    gradient_terms,
    logprob_terms,
    make_critic,
    response_logprob_scale,
    run_two_ranks,
    whole,
)
from worker_factory import make_actor as _actor

from search_rl.batches import TrainBatch
from search_rl.models import build_tiny_model
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker


def test_recomputed_logprobs_match_the_engine(rollout_batch, tokenizer):
    mask = rollout_batch.response_mask.bool()
    assert (~mask & rollout_batch.response_attention_mask.bool()).any(), "the rollout should contain observations"
    # the engine's KV-cached batched decode and the trainer's one pass sum in other orders (numerics.py)
    engine = rollout_batch.rollout_logprobs[mask]
    scale = response_logprob_scale(build_tiny_model(tokenizer, seed=0), rollout_batch)  # the weights that sampled
    assert_reordered_close(rollout_batch.old_logprobs[mask], engine, logprob_terms(rollout_batch), scale=scale)
    # the reference is a copy of the untrained policy run through the same code and shapes: equal, bit for bit
    torch.testing.assert_close(rollout_batch.ref_logprobs, rollout_batch.old_logprobs, rtol=0, atol=0)


def _gradients(worker: ActorRolloutRefWorker, batch: TrainBatch) -> list[torch.Tensor]:
    """Run an actor update and return the gradients of every optimizer step, in order."""
    if worker.trainable is None:
        worker.init_distributed("127.0.0.1", 0)
    trainable = worker.trainable
    assert trainable is not None
    captured: list[torch.Tensor] = []
    trainable.optimizer.register_step_pre_hook(lambda *_: captured.extend(whole(p.grad) for p in trainable.params))
    worker.update_actor(batch, step=1)
    return captured


def _steps(worker: ActorRolloutRefWorker, batch: TrainBatch) -> StepCapture:
    """Run an actor update (one process); every optimizer step's gradients and their ``GradientTerms`` sums."""
    worker.init_distributed("127.0.0.1", 0)
    capture = StepCapture(worker)
    worker.update_actor(batch, step=1)
    return capture


def test_micro_batches_accumulate_to_the_same_gradient(rollout_batch):
    # two mini-batches of 2 prompts x 2 samples: two optimizer steps, of 4 and of 1 micro-batch(es) each
    one = _steps(_actor(micro=1, mini=2), rollout_batch)
    four = _steps(_actor(micro=4, mini=2), rollout_batch)
    assert len(one.grads) == len(four.grads) > 0
    for a, b, terms in zip(one.grads, four.grads, one.terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(rollout_batch), scale=terms)


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_shared_prompts_give_the_gradient_of_full_passes(rollout_batch, lora_rank):
    """Each distinct prompt encoded once per mini-batch (FSDP2-sharded policy, adapters or not): the same gradients
    and log-probs as passes that encode every sample's prompt, with fewer tokens counted."""
    batch = rollout_batch.select(torch.tensor([0, 2, 1, 3, 4, 6, 5, 7]))  # micro-batches of 2 split each group
    workers = []
    for share in (False, True):
        torch.manual_seed(0)  # the same random adapter initialisation
        workers.append(_actor(micro=2, mini=2, lora_rank=lora_rank, share_prompts=share))
        workers[-1].init_distributed("127.0.0.1", 0)
    plain, shared = workers
    n, scale = logprob_terms(batch), response_logprob_scale(plain.module, batch)
    assert_reordered_close(shared.compute_log_prob(batch)[0], plain.compute_log_prob(batch)[0], n, scale=scale)
    assert_reordered_close(shared.compute_ref_log_prob(batch), plain.compute_ref_log_prob(batch), n, scale=scale)
    tokens = {}
    steps = {}
    for name, worker in (("plain", plain), ("shared", shared)):
        steps[name] = StepCapture(worker)  # the plain passes' sums: each sample's prompt is its own terms
        tokens[name] = worker.update_actor(batch, step=1)["perf/actor_update_tokens"]
    assert len(steps["plain"].grads) == len(steps["shared"].grads) > 0
    for a, b, terms in zip(steps["shared"].grads, steps["plain"].grads, steps["plain"].terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(batch), scale=terms)
    prompt_tokens = int(batch.attention_mask[:, : batch.prompt_length].sum())
    # two samples per prompt, each mini-batch holds both: half the prompt tokens (but the last of each) are saved
    assert tokens["plain"] - tokens["shared"] == (prompt_tokens - len(batch)) // 2


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_old_logprobs_computed_in_the_update_give_the_recomputed_gradients(rollout_batch, shuffle):
    """``old_source="update"``: the first mini-batch takes the update's own log-probs (no step has moved the weights
    yet) and a no-grad pass covers only the other mini-batches' rows; every optimizer step gets the gradient of the
    update given recomputed old log-probs, and the pass's metrics are those of a recompute over the whole batch."""
    recomputed = _steps(_actor(micro=2, mini=2, shuffle=shuffle), rollout_batch)
    worker = _actor(micro=2, mini=2, shuffle=shuffle)
    worker.init_distributed("127.0.0.1", 0)
    old, entropy = worker.compute_log_prob(rollout_batch)  # what a recompute pass gives (no grad, weights unchanged)
    n = logprob_terms(rollout_batch)  # each value is the pass's reduction, summed in another order by the update
    scales = [response_logprob_scale(worker.module, rollout_batch, entropy=e) for e in (False, True)]
    passed: list[int] = []
    log_probs = worker._log_probs
    worker._log_probs = lambda model, batch, *a: passed.append(len(batch)) or log_probs(model, batch, *a)  # type: ignore[method-assign]
    capture = StepCapture(worker)
    metrics = worker.update_actor(rollout_batch.replace(old_logprobs=None), step=1, old_source="update")
    assert passed == [4], "the pass covers the second mini-batch's 4 rows only"
    assert len(recomputed.grads) == len(capture.grads) > 0  # two optimizer steps, each parameter's gradient
    for a, b, terms in zip(recomputed.grads, capture.grads, recomputed.terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(rollout_batch), scale=terms)
    # a token mean moves by at most its tokens' largest difference (|x - r| is 1-Lipschitz in x), plus the mean's
    # own summation order over the loss tokens
    mask = rollout_batch.loss_mask.float()
    tokens = int(mask.sum())
    for key, values, scale in (
        ("actor/entropy_rollout", entropy, scales[1]),
        ("rollout/logprob_abs_diff", (old - rollout_batch.rollout_logprobs).abs(), scales[0]),
    ):
        expected = float((values * mask).sum() / tokens)
        tol = reorder_tol(n) * scale + reorder_tol(tokens) * float((values * mask).abs().max())
        assert abs(metrics[key] - expected) <= tol, (key, metrics[key], expected, tol)
    two_epochs = _actor(micro=2, mini=2, ppo_epochs=2)
    two_epochs.init_distributed("127.0.0.1", 0)
    with pytest.raises(ValueError, match="needs one epoch"):
        two_epochs.update_actor(rollout_batch.replace(old_logprobs=None), step=1, old_source="update")


def _rank_gradients(rank: int, port: int, out: dict, batch: TrainBatch) -> None:
    worker = _actor(micro=1, mini=4, rank=rank, world=2)
    worker.init_distributed("127.0.0.1", port)
    shard = batch.split(2)[rank]
    out[rank] = [g.clone() for g in _gradients(worker, shard)]


@pytest.mark.slow
def test_two_gloo_ranks_give_the_single_process_gradient(rollout_batch):
    # one optimizer step over all 8 samples: one process with micro-batches of 2, or two ranks with 4 samples each
    single = _steps(_actor(micro=2, mini=4), rollout_batch)
    ranks = run_two_ranks(_rank_gradients, rollout_batch, timeout_s=240)
    assert len(ranks[0]) == len(ranks[1]) == len(single.grads)
    for a, b, ref, terms in zip(ranks[0], ranks[1], single.grads, single.terms, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # both ranks gather the same reduced gradient
        assert_reordered_close(a, ref, gradient_terms(rollout_batch), scale=terms)


def test_critic_values_and_update(rollout_batch):
    critic = make_critic()
    critic.init_distributed("127.0.0.1", 0)
    values = critic.compute_values(rollout_batch)
    assert values.shape == rollout_batch.response_ids.shape and values.abs().sum() == 0  # zero-initialised head
    batch = rollout_batch.replace(values=values, returns=torch.ones_like(values) * rollout_batch.loss_mask)
    metrics = critic.update_critic(batch, step=1)
    assert metrics["critic/vf_loss"] > 0 and metrics["critic/grad_norm"] > 0
    assert critic.compute_values(batch).abs().sum() > 0


def test_checkpoint_round_trip(rollout_batch, tmp_path):
    a = _actor()
    a.init_distributed("127.0.0.1", 0)
    a.update_actor(rollout_batch, step=1)
    a.save_checkpoint(str(tmp_path))
    assert (tmp_path / "actor" / "config.json").is_file() and (tmp_path / "actor" / "tokenizer_config.json").is_file()
    b = _actor()
    b.init_distributed("127.0.0.1", 0)
    b.load_checkpoint(str(tmp_path))
    for (name, pa), pb in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    # both continue identically: same optimizer state
    ma, mb = a.update_actor(rollout_batch, step=2), b.update_actor(rollout_batch, step=2)
    assert ma == mb
    assert b.sync_weights(2) == (2, [])


def test_on_policy_update_without_old_logprobs_gives_the_recomputed_gradient(rollout_batch):
    # one mini-batch of the whole batch, one epoch: the update's own log-probs (detached) are the old ones
    recomputed = _steps(_actor(micro=2, mini=4), rollout_batch)
    worker = _actor(micro=2, mini=4)
    worker.init_distributed("127.0.0.1", 0)
    trainable = worker.trainable
    assert trainable is not None
    captured: list[torch.Tensor] = []
    trainable.optimizer.register_step_pre_hook(lambda *_: captured.extend(whole(p.grad) for p in trainable.params))
    worker.update_actor(rollout_batch.replace(old_logprobs=None), step=1, old_source="current")
    assert len(recomputed.grads) == len(captured) > 0
    for a, b, terms in zip(recomputed.grads, captured, recomputed.terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(rollout_batch), scale=terms)
    two_steps = _actor(micro=2, mini=2)
    two_steps.init_distributed("127.0.0.1", 0)
    with pytest.raises(ValueError, match="one optimizer step over one epoch"):
        two_steps.update_actor(rollout_batch.replace(old_logprobs=None), step=1, old_source="current")
