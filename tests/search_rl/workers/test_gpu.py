"""The FSDP2 path on a GPU (NCCL, one rank, bf16 compute): skipped where CUDA is absent, as in CI.

The CPU tests (``test_fsdp.py``) prove the same invariants on gloo; this checks the device-specific parts: NCCL
start-up, bf16 autocast through ``MixedPrecisionPolicy`` on CUDA, the engine's CUDA copy, peak-memory metric.

Run on a GPU machine: python -m pytest tests/search_rl/workers/test_gpu.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import BF16_EPS, assert_reordered_close
from worker_factory import make_actor, whole

from search_rl.batches import TrainBatch

pytestmark = pytest.mark.gpu


def test_bf16_update_and_engine_sync_on_cuda(rollout_batch: TrainBatch, tokenizer):
    actor = make_actor(lr=1e-6, dtype="bfloat16", device="cuda")
    actor.init_distributed("127.0.0.1", 0)
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}
    assert {p.device.type for p in actor.module.parameters()} == {"cuda"}
    before = {k: whole(v) for k, v in actor.module.state_dict().items()}
    metrics = actor.update_actor(rollout_batch, step=1)
    assert metrics["perf/max_memory_allocated_gb"] > 0
    after = {k: whole(v) for k, v in actor.module.state_dict().items()}
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    assert changed / sum(v.numel() for v in before.values()) > 0.5
    assert actor.sync_weights(1) == (1, [])
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")], device="cuda")
    with torch.no_grad():
        engine_logits = actor.engine_model(input_ids=ids).logits.float()
        policy_logits = actor.module(input_ids=ids).logits.float()
    # both forwards run the same bf16 weights, each kernel accumulating in fp32 in its own order and rounding its
    # output to bf16: a logit carries the roundings of the activations on its path (4 a layer: attention, its output
    # projection, the MLP, its down projection; then the head), each up to a bf16 step that the RMS-normalised
    # layers pass on at about their size, so two forwards differ by at most 2 * that many steps at the logits' scale
    roundings = 4 * actor.engine_model.config.num_hidden_layers + 1
    assert_reordered_close(engine_logits, policy_logits, roundings, eps=BF16_EPS)
