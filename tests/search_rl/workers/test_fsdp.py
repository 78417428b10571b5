"""FSDP2, the one data-parallel path (gloo here, NCCL on GPUs): the defects it fixed and the invariants it keeps.

- A tied model's gathered full state dict (which names ``lm_head.weight``) loads into the HF engine.
- bf16 compute trains fp32 master weights: an lr 1e-6 update changes them (bf16 master weights would not move).
- The engine export of a 2-rank model holds whole tensors of the model's shapes, loadable by ``from_pretrained``.
- A 2-rank step equals a 1-rank step on the same global batch, with and without micro-batching.
- Checkpoints reshard: saved by 2 ranks, resumed by 1, and the reverse; ties survive; ``actor/`` is a plain HF folder.

Run: python -m pytest tests/search_rl/workers/test_fsdp.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from numerics import assert_reordered_close
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from worker_factory import (
    GradientTerms,
    assert_same_adamw_step,
    assert_terms_cover,
    gradient_terms,
    logprob_terms,
    make_actor,
    make_critic,
    response_logprob_scale,
    run_two_ranks,
    whole,
)

from search_rl.batches import TrainBatch
from search_rl.config import HFEngineConfig
from search_rl.models import build_tiny_model
from search_rl.rollout.engines.hf import HFEngine
from search_rl.workers import WorkerSpec
from search_rl.workers import distributed as D

TIED = ("model.embed_tokens.weight", "lm_head.weight")


def _weights(worker) -> dict[str, torch.Tensor]:
    return {k: whole(v) for k, v in worker.module.state_dict().items()}


def test_full_state_dict_of_a_tied_model_syncs_into_the_hf_engine(tokenizer):
    spec = WorkerSpec(rank=0, world_size=1)
    D.init_process_group(spec, "127.0.0.1", 0)
    policy = D.shard(build_tiny_model(tokenizer, seed=1), spec, torch.float32)
    state = D.full_state_dict(policy)
    assert set(TIED) <= set(state)  # the gathered dict names the tied head too (it crashed the engine before)
    engine = HFEngine(build_tiny_model(tokenizer, seed=2), tokenizer, HFEngineConfig())
    engine.update_weights(state.items(), version=7)
    assert engine.weight_version == 7
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")])
    with torch.no_grad():  # the same weights through the same code and shapes: the same kernels, bit for bit
        torch.testing.assert_close(model(input_ids=ids).logits, policy(input_ids=ids).logits, rtol=0, atol=0)
    with pytest.raises(KeyError, match="no tensor was given"):  # a partial update never leaves stale weights
        engine.update_weights([("model.norm.weight", state["model.norm.weight"])], version=8)


def test_bf16_master_weights_swallow_small_updates_fp32_do_not():
    # The defect: 10 AdamW steps at lr 1e-6 on bf16 weights near 0.02 change none of them.
    weights = torch.nn.Parameter((0.02 + 0.001 * torch.randn(1000)).to(torch.bfloat16))
    optimizer = torch.optim.AdamW([weights], lr=1e-6, weight_decay=0.0)
    before = weights.detach().clone()
    for _ in range(10):
        weights.grad = torch.randn_like(weights)
        optimizer.step()
    assert int((weights.detach() != before).sum()) == 0


def test_bf16_compute_updates_the_fp32_master_weights(rollout_batch: TrainBatch):
    actor = make_actor(lr=1e-6, dtype="bfloat16")
    actor.init_distributed("127.0.0.1", 0)
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}  # the master copy
    assert actor.engine_model is not None and actor.engine_model.dtype == torch.bfloat16
    logits = []
    handle = actor.module.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out.dtype))
    before = _weights(actor)
    actor.update_actor(rollout_batch, step=1)
    handle.remove()
    assert logits and set(logits) == {torch.bfloat16}  # the forward ran in the compute dtype
    after = _weights(actor)
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    total = sum(v.numel() for v in before.values())
    assert changed / total > 0.5, f"only {changed} of {total} master weights moved"
    # the critic the same way
    critic = make_critic(lr=1e-6, dtype="bfloat16")
    critic.init_distributed("127.0.0.1", 0)
    assert {p.dtype for p in critic.module.parameters()} == {torch.float32}
    values = critic.compute_values(rollout_batch)
    batch = rollout_batch.replace(values=values, returns=torch.ones_like(values) * rollout_batch.loss_mask)
    before = _weights(critic)
    critic.update_critic(batch, step=1)
    after = _weights(critic)
    assert sum(int((before[k] != after[k]).sum()) for k in before) > 0


def test_engine_sync_after_an_update_gives_the_engine_the_policy(rollout_batch: TrainBatch, tokenizer):
    actor = make_actor()
    actor.init_distributed("127.0.0.1", 0)
    actor.update_actor(rollout_batch, step=1)
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")])
    assert actor.engine is not None and actor.engine_model is not None
    with torch.no_grad():
        policy_logits = actor.module(input_ids=ids).logits
        assert not torch.allclose(actor.engine_model(input_ids=ids).logits, policy_logits)  # stale until synced
        assert actor.sync_weights(1) == (1, [])
        torch.testing.assert_close(actor.engine_model(input_ids=ids).logits, policy_logits, rtol=0, atol=0)


def _rank_export(rank: int, port: int, out: dict, directory: str) -> None:
    worker = make_actor(rank=rank, world=2, dtype="bfloat16")
    worker.init_distributed("127.0.0.1", port)
    worker.export_for_engine(str(Path(directory) / f"rank{rank}"))
    out[rank] = True


@pytest.mark.slow
def test_engine_export_of_a_two_rank_model_has_whole_tensors(tmp_path, tokenizer):
    run_two_ranks(_rank_export, str(tmp_path))
    reference = build_tiny_model(tokenizer)  # the tiny model is deterministic: the ranks started from these weights
    expected = {k: v for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    for rank in (0, 1):
        folder = tmp_path / f"rank{rank}"
        tensors = load_file(str(folder / "model.safetensors"))
        assert {k: tuple(v.shape) for k, v in tensors.items()} == {k: tuple(v.shape) for k, v in expected.items()}
        assert {v.dtype for v in tensors.values()} == {torch.bfloat16}
        for name, value in tensors.items():
            # the same fp32 weights, rounded to bf16 the one way there is: equal, not bf16-close
            torch.testing.assert_close(value, expected[name].to(torch.bfloat16), rtol=0, atol=0, msg=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


def _step_gradients(worker) -> list[torch.Tensor]:
    """A list that each optimizer step of ``worker`` fills with the whole gradients it uses (and, on a step after
    the first, appends the moments it starts from: ``(exp_avg, exp_avg_sq)`` per parameter)."""
    trainable = worker.trainable
    captured: list = []

    def capture(*_) -> None:
        captured.extend(whole(p.grad) for p in trainable.params)
        states = [trainable.optimizer.state.get(p, {}) for p in trainable.params]
        captured.append([(whole(st["exp_avg"]), whole(st["exp_avg_sq"])) if st else None for st in states])

    trainable.optimizer.register_step_pre_hook(capture)
    return captured


def _rank_step(rank: int, port: int, out: dict, batch: TrainBatch, micro: int) -> None:
    worker = make_actor(micro=micro, mini=4, rank=rank, world=2)
    worker.init_distributed("127.0.0.1", port)
    # 5 rows over 2 ranks: 3 and 2 forward passes with micro-batches of 1; the shorter rank pads (matched_passes)
    uneven = worker.compute_log_prob(batch.select(torch.arange(5)).split(2)[rank])[0]
    grads = _step_gradients(worker)
    worker.update_actor(batch.split(2)[rank], step=1)
    out[rank] = (_weights(worker), uneven, grads[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("micro", [1, 4], ids=["micro-batches-of-1", "no-micro-batching"])
def test_two_ranks_take_the_single_process_step(rollout_batch: TrainBatch, micro: int):
    # One optimizer step over all 8 samples: 2 ranks sum the gradient in another order than 1, so the gradients
    # agree to that reordering and the step moved each weight as Adam moves it for the two gradients (where a
    # gradient is within rounding of 0, Adam's normalisation alone puts the weights up to 2 lr apart).
    single = make_actor(micro=micro, mini=4)
    single.init_distributed("127.0.0.1", 0)
    five = rollout_batch.select(torch.arange(5))
    logprobs, scale = single.compute_log_prob(five)[0], response_logprob_scale(single.module, five)
    grads, terms = _step_gradients(single), GradientTerms(single.module)
    single.update_actor(rollout_batch, step=1)
    expected = _weights(single)
    ranks = run_two_ranks(_rank_step, rollout_batch, micro)
    uneven = torch.cat([ranks[0][1], ranks[1][1]])
    assert_reordered_close(uneven, logprobs, logprob_terms(five), scale=scale)
    for name in expected:
        torch.testing.assert_close(ranks[0][0][name], ranks[1][0][name], rtol=0, atol=0, msg=name)
    n = gradient_terms(rollout_batch)
    _assert_same_step(single, ranks[0][0], expected, ranks[0][2], grads[:-1], terms.take(), n)


def _assert_same_step(worker, a, b, grads_a, grads_b, terms, n_terms: int, step: int = 1, moments=None) -> None:
    """``a`` and ``b`` (weights by name) are the same AdamW step of ``worker``'s parameters from the same weights:
    the gradients agree to a reordering of ``n_terms`` terms (at ``terms``, ``grads_b``'s ``GradientTerms`` sums)
    and each weight moved as Adam moves it for its run's gradient."""
    assert a.keys() == b.keys()
    names = [n for n, p in worker.module.named_parameters() if p.requires_grad]  # the optimizer's order
    assert len(names) == len(grads_a) == len(grads_b) == len(terms) > 0
    assert_terms_cover(grads_b, terms)
    for name, ga, gb, t in zip(names, grads_a, grads_b, terms, strict=True):
        assert_reordered_close(ga, gb, n_terms, scale=t, msg=name)
    assert_same_adamw_step([a[k] for k in names], [b[k] for k in names], grads_a, grads_b, 1e-3, step, moments)


def _rank_save(rank: int, port: int, out: dict, batch: TrainBatch, directory: str) -> None:
    worker = make_actor(micro=2, mini=4, rank=rank, world=2)
    worker.init_distributed("127.0.0.1", port)
    worker.update_actor(batch.split(2)[rank], step=1)
    worker.save_checkpoint(directory)
    out[rank] = _weights(worker)


def _rank_load(rank: int, port: int, out: dict, batch: TrainBatch, directory: str) -> None:
    worker = make_actor(micro=2, mini=4, rank=rank, world=2)
    worker.init_distributed("127.0.0.1", port)
    worker.load_checkpoint(directory)
    loaded = _weights(worker)
    grads = _step_gradients(worker)
    worker.update_actor(batch.split(2)[rank], step=2)
    tied = worker.module.lm_head.weight is worker.module.model.embed_tokens.weight
    out[rank] = (loaded, _weights(worker), tied, grads[:-1])


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tol)


@pytest.mark.slow
def test_checkpoints_reshard_between_two_ranks_and_one(rollout_batch: TrainBatch, tmp_path):
    # 2 ranks save -> 1 rank resumes: same weights, still tied, and the next step matches the 2-rank run's
    saved = run_two_ranks(_rank_save, rollout_batch, str(tmp_path / "two"))[0]
    one = make_actor(micro=2, mini=4)
    one.init_distributed("127.0.0.1", 0)
    one.load_checkpoint(str(tmp_path / "two"))
    _assert_same(_weights(one), saved, rtol=0, atol=0)
    assert one.module.lm_head.weight is one.module.model.embed_tokens.weight
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "actor", local_files_only=True)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    _assert_same({k: v.detach() for k, v in plain.state_dict().items()}, saved, rtol=0, atol=0)

    # 1 rank saves -> 2 ranks resume; the optimizer state came along: one more step agrees with the 1-rank one
    one.save_checkpoint(str(tmp_path / "one"))
    captured, terms = _step_gradients(one), GradientTerms(one.module)
    one.update_actor(rollout_batch, step=2)
    grads, moments = captured[:-1], captured[-1]
    assert all(m is not None for m in moments), "the resumed optimizer starts from step 1's moments"
    loaded, stepped, tied, rank_grads = run_two_ranks(_rank_load, rollout_batch, str(tmp_path / "one"))[0]
    _assert_same(loaded, saved, rtol=0, atol=0)
    assert tied
    n = gradient_terms(rollout_batch)
    _assert_same_step(one, stepped, _weights(one), rank_grads, grads, terms.take(), n, 2, moments)


def _rank_start(rank: int, port: int, out: dict) -> None:
    spec = WorkerSpec(rank=rank, world_size=2)
    D.init_process_group(spec, "127.0.0.1", port)
    out[rank] = D.all_reduce_sum(float(rank + 1), spec)


@pytest.mark.slow
def test_the_group_starts_every_time():
    # Start-up of a 2-rank group, three times in a row (one start in six aborted before the store held its port).
    for _ in range(3):
        assert run_two_ranks(_rank_start) == {0: 3.0, 1: 3.0}


def test_training_refuses_float16_naming_the_key():
    from search_rl.config import ConfigError
    from search_rl.configure import load_config

    with pytest.raises(ConfigError, match=r"model\.dtype=float16 .*bfloat16"):
        load_config(["model.dtype=float16"])
    assert load_config(["model.dtype=bfloat16"]).model.dtype == "bfloat16"
