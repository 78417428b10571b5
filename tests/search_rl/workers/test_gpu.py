"""The FSDP2 path on a GPU (NCCL, one rank, bf16 compute): skipped where CUDA is absent, as in CI.

The CPU tests (``test_fsdp.py``) prove the same invariants on gloo; this checks the device-specific parts: NCCL
start-up, bf16 autocast through ``MixedPrecisionPolicy`` on CUDA, the engine's CUDA copy, peak-memory metric. The
engine-sync check it ends with (``worker_factory.assert_engine_serves_policy``) runs on CPU here too, in bf16, where
it must fail an engine that missed the sync and an update too small to tell one apart.

Run on a GPU machine: python -m pytest tests/search_rl/workers/test_gpu.py -q
"""

from __future__ import annotations

import pytest
import torch
from worker_factory import assert_engine_serves_policy, engine_view, make_actor, whole

from search_rl.batches import TrainBatch

SYNC_LR = 1e-2
"""Large enough that the update moves every bf16 weight of the tiny model (Adam's first step moves each weight by
about ``lr``; a weight of size ``w`` keeps its bf16 value while the move is under half its step, ``w * 2^-8``, which at
lr 1e-6 holds for 96% of them) and its logits far beyond rounding (measured on CPU: 0.97 against a bound of 0.064)."""


@pytest.mark.gpu
def test_bf16_update_and_engine_sync_on_cuda(rollout_batch: TrainBatch, tokenizer):
    actor = make_actor(lr=SYNC_LR, dtype="bfloat16", device="cuda")
    actor.init_distributed("127.0.0.1", 0)
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}
    assert {p.device.type for p in actor.module.parameters()} == {"cuda"}
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")], device="cuda")
    stale = engine_view(actor, ids)
    before = {k: whole(v) for k, v in actor.module.state_dict().items()}
    metrics = actor.update_actor(rollout_batch, step=1)
    assert metrics["perf/max_memory_allocated_gb"] > 0
    after = {k: whole(v) for k, v in actor.module.state_dict().items()}
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    assert changed / sum(v.numel() for v in before.values()) > 0.5
    assert actor.sync_weights(1) == (1, [])
    assert_engine_serves_policy(actor, ids, stale)


@pytest.mark.parametrize("lr", [SYNC_LR, 1e-6])
def test_the_sync_check_fails_a_stale_engine_on_cpu(rollout_batch: TrainBatch, tokenizer, lr: float):
    """The GPU test's check on CPU in bf16: an engine not synced after the update fails it (at ``SYNC_LR``), and so
    does an update too small to move the served weights (lr 1e-6, what the GPU test ran at), synced or not."""
    actor = make_actor(lr=lr, dtype="bfloat16")
    actor.init_distributed("127.0.0.1", 0)
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")])
    stale = engine_view(actor, ids)
    actor.update_actor(rollout_batch, step=1)
    with pytest.raises(AssertionError, match="not the policy's weights"):
        assert_engine_serves_policy(actor, ids, stale)  # the planted bug: the engine missed the sync
    assert actor.sync_weights(1) == (1, [])
    if lr == SYNC_LR:
        assert_engine_serves_policy(actor, ids, stale)
    else:
        with pytest.raises(AssertionError, match="a stale engine would pass"):
            assert_engine_serves_policy(actor, ids, stale)
