"""LoRA adapters on the policy (``model.lora_rank``): only adapters train, the frozen base is the reference, the
engine and checkpoints get merged weights, and a checkpoint's adapters resume exactly.

Run: python -m pytest tests/search_rl/workers/test_lora.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch
from numerics import assert_reordered_close
from transformers import AutoModelForCausalLM
from worker_factory import logprob_terms, make_actor, response_logprob_scale, whole

from search_rl.batches import TrainBatch
from search_rl.models import build_tiny_model
from search_rl.models.lora import ADAPTER_DIR, apply_lora, lora_scaling, merged_state_dict
from search_rl.workers.forward import response_logprobs

pytestmark = pytest.mark.slow  # LoRA actor updates, several seconds each


def _randomise_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at 0 (the adapter is a no-op); make it do something
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_adapters_are_seeded_and_leave_the_global_generator_alone(tokenizer):
    def adapters(seed: int) -> dict[str, torch.Tensor]:
        wrapped = apply_lora(build_tiny_model(tokenizer, seed=1), 4, 8, "all-linear", seed=seed)
        return {k: v.clone() for k, v in wrapped.state_dict().items() if "lora_A" in k}

    state = torch.random.get_rng_state()
    first, again, other = adapters(0), adapters(0), adapters(1)
    assert torch.equal(torch.random.get_rng_state(), state), "the global generator is restored"
    assert first and all(torch.equal(first[k], again[k]) for k in first), "one seed, the same A (a seeded run repeats)"
    assert not any(torch.equal(first[k], other[k]) for k in first)


def test_merged_state_dict_equals_peft_merge_and_unload(tokenizer):
    wrapped = apply_lora(build_tiny_model(tokenizer, seed=1), rank=4, alpha=8, target_modules="all-linear")
    _randomise_adapters(wrapped)
    ours = merged_state_dict(wrapped.state_dict(), lora_scaling(wrapped))
    assert lora_scaling(wrapped) == 2.0
    # the terms' absolute values merged the same way: |W| + scaling * |B| @ |A| (B @ A's terms cancel)
    terms = merged_state_dict({k: v.abs() for k, v in wrapped.state_dict().items()}, lora_scaling(wrapped))
    reference = copy.deepcopy(wrapped).merge_and_unload().state_dict()
    assert set(ours) == set(reference)
    changed = 0
    base = build_tiny_model(tokenizer, seed=1).state_dict()
    for name, tensor in reference.items():
        # W + scaling * B @ A in both, perhaps in another order: a rank-4 product and one sum (numerics.py)
        assert_reordered_close(ours[name], tensor, 4 + 1, scale=terms[name], msg=name)
        changed += int(not torch.equal(ours[name], base[name]))
    assert changed >= 7 * 2, "every adapted linear layer (7 per decoder layer) should differ from the base"


def _logprobs(model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(model.eval(), batch, 1.0)[0]


def test_lora_actor_trains_adapters_only_and_its_base_is_the_reference(rollout_batch, tmp_path):
    worker = make_actor(micro=4, mini=4, lora_rank=4, lr=1e-2)
    assert worker.reference is None, "with adapters the reference is the base, not a second copy"
    worker.init_distributed("127.0.0.1", 0)
    assert worker.trainable is not None
    trained = {n for n, p in worker.module.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    base_before = {n: whole(p) for n, p in worker.module.named_parameters() if not p.requires_grad}
    ref_before = worker.compute_ref_log_prob(rollout_batch)

    metrics = worker.update_actor(rollout_batch, step=1)
    assert metrics["actor/grad_norm"] > 0
    for name, p in worker.module.named_parameters():
        if not p.requires_grad:
            assert torch.equal(whole(p), base_before[name]), f"frozen {name} moved"
    policy = worker.compute_log_prob(rollout_batch)[0]
    mask = rollout_batch.response_mask.bool()
    assert (policy - ref_before)[mask].abs().max() > 1e-3, "the update should move the policy"
    # the frozen base through the same code and shapes: equal, bit for bit
    torch.testing.assert_close(worker.compute_ref_log_prob(rollout_batch), ref_before, rtol=0, atol=0)

    # the engine gets the merged weights: its model computes what the adapted policy computes
    assert worker.sync_weights(1) == (1, [])
    assert worker.engine_model is not None
    # merged weights compute x (W + s B A) where the policy computes x W + s (x A) B: another order (numerics.py)
    n, scale = logprob_terms(rollout_batch), response_logprob_scale(worker.engine_model, rollout_batch)
    assert_reordered_close(_logprobs(worker.engine_model, rollout_batch)[mask], policy[mask], n, scale=scale)

    # the checkpoint: a merged HF folder (what evaluation loads) and the adapters, which resume exactly
    worker.save_checkpoint(str(tmp_path))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "actor", dtype=torch.float32, local_files_only=True)
    assert_reordered_close(_logprobs(merged, rollout_batch)[mask], policy[mask], n, scale=scale)
    assert (tmp_path / ADAPTER_DIR / "adapter_config.json").exists()
    fresh = make_actor(micro=4, mini=4, lora_rank=4, lr=1e-2)
    fresh.init_distributed("127.0.0.1", 0)
    fresh.load_checkpoint(str(tmp_path))
    # the adapters resume exactly: the same weights through the same code, bit for bit
    torch.testing.assert_close(fresh.compute_log_prob(rollout_batch)[0], policy, rtol=0, atol=0)
    torch.testing.assert_close(fresh.compute_ref_log_prob(rollout_batch), ref_before, rtol=0, atol=0)
