"""bf16 compute (``model.dtype=bfloat16``, what ``auto`` picks on CUDA and on CPUs with AMX or AVX512-BF16) over fp32
master weights:

- the HF and static engines, generating in bf16, sample log-probs the bf16 trainer (FSDP2 mixed precision)
  recomputes to within the rounding of bf16 logits, and every log-prob comes out float32;
- a tiny-model run learns in bf16 as in float32 (SFT steps on the same batch);
- ranks that resolved different compute dtypes are refused before FSDP2 exchanges parameters.

Run: python -m pytest tests/search_rl/workers/test_bf16_compute.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from worker_factory import ALGO, ROLLOUT, make_actor, run_two_ranks

from search_rl.batches import BatchMeta, TrainBatch
from search_rl.config import ActorConfig, ModelConfig, OptimConfig, RefConfig, RetrieverClientConfig
from search_rl.prompt_data import PromptDataset, read_rows
from search_rl.trainer.steps import build_train_batch
from search_rl.workers import WorkerSpec
from search_rl.workers import distributed as D
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker

BF16_UNIT_ROUNDOFF = torch.finfo(torch.bfloat16).eps / 2
"""2^-8: the largest relative error of rounding a value to bf16."""


def _bf16_actor(engine: str) -> ActorRolloutRefWorker:
    worker = ActorRolloutRefWorker(
        WorkerSpec(rank=0, world_size=1, torch_threads=1),
        ModelConfig(path="tiny", dtype="bfloat16"),
        ActorConfig(optim=OptimConfig(lr=1e-3), ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, shuffle=False),
        dataclasses.replace(ROLLOUT, engine=engine),
        RefConfig(),
        ALGO,
        RetrieverClientConfig(url="http://127.0.0.1:9"),  # never called: the random model writes no valid search
    )
    worker.init_distributed("127.0.0.1", 0)
    return worker


def _rollout(worker: ActorRolloutRefWorker, tokenizer) -> TrainBatch:
    """4 sampled responses (2 prompts x 2) of ``worker``'s engine, with its sampling log-probs (few: bf16 is emulated
    on an AVX2 CPU, where a pass over them takes seconds)."""
    rows = read_rows(["data/datasets/nq_hotpotqa_mini/train.parquet"])[:2]
    prompts = PromptDataset(rows, tokenizer, 512, False).batch(range(2)).repeat_interleave(2)
    result = worker.generate(prompts, False, 123)
    return build_train_batch(result.trajectories, prompts, tokenizer.pad_token_id, 96, BatchMeta(step=1))


@pytest.mark.parametrize("engine", ["hf", "static"])
def test_bf16_engines_sample_what_the_bf16_trainer_recomputes(engine, tokenizer):
    worker = _bf16_actor(engine)
    assert worker.engine_model is not None and worker.engine_model.dtype == torch.bfloat16
    batch = _rollout(worker, tokenizer)
    recomputed, entropy = worker.compute_log_prob(batch)  # FSDP2: fp32 masters cast to bf16 for the forward
    assert recomputed.dtype == entropy.dtype == batch.rollout_logprobs.dtype == torch.float32
    with torch.no_grad():  # M from one row's logits: the rows share the model (all of them cost seconds in bf16 here)
        scale = float(
            worker.module(input_ids=batch.input_ids[:1], attention_mask=batch.attention_mask[:1]).logits.abs().max()
        )
    mask = batch.response_mask.bool()
    diff = (recomputed[mask] - batch.rollout_logprobs[mask]).abs()
    # Engine and trainer each compute the logits in bf16, in other orders (KV-cached decode vs one pass): a logit of
    # magnitude up to M is off by about M * 2^-8, and log p = z - logsumexp(z) moves by as much, so per token
    # |delta log p| is of order M * 2^-8 and its mean below it. Measured on the tiny model (M 1.43): mean 3.2e-4
    # (hf) and 3.8e-4 (static), max 2.0e-3, against a bound of 5.6e-3. A log-softmax over bf16 logits would round
    # log p ~ -10.8 to steps of 0.0625 (a mean error ~1.6e-2), and a misaligned token would be off by nats.
    bound = scale * BF16_UNIT_ROUNDOFF
    assert float(diff.mean()) <= bound, f"mean |delta log p| {float(diff.mean()):.3g} > M * 2^-8 = {bound:.3g}"


def test_bf16_compute_learns_as_float32_does(tokenizer):
    bf16 = make_actor(dtype="bfloat16", micro=2, mini=2)
    bf16.init_distributed("127.0.0.1", 0)
    batch = _rollout(bf16, tokenizer).select(torch.arange(2))  # one prompt's two samples
    batch = batch.replace(loss_mask=batch.response_mask)
    nll = {}
    for dtype in ("float32", "bfloat16"):
        worker = bf16 if dtype == "bfloat16" else make_actor(dtype=dtype, micro=2, mini=2)
        if worker.trainable is None:
            worker.init_distributed("127.0.0.1", 0)
        nll[dtype] = [worker.update_sft(batch)["sft/nll"] for _ in range(3)]  # each before its step's update
    drop = {dtype: values[0] - values[-1] for dtype, values in nll.items()}
    assert drop["float32"] > 0.1, nll
    # The bf16 gradients differ from float32's by rounding (a few 2^-8 relative), not in direction: the NLL falls
    # alike (measured: 0.3185 in float32, 0.3180 in bf16 over two steps).
    assert drop["bfloat16"] >= 0.9 * drop["float32"], nll


def _rank_shard(rank: int, port: int, out: dict) -> None:
    spec = WorkerSpec(rank=rank, world_size=2)
    D.init_process_group(spec, "127.0.0.1", port)
    try:
        D.shard(torch.nn.Linear(4, 4), spec, torch.float32 if rank == 0 else torch.bfloat16)
        out[rank] = "sharded"
    except ValueError as e:
        out[rank] = str(e)


@pytest.mark.slow
def test_ranks_that_resolved_different_dtypes_are_refused():
    out = run_two_ranks(_rank_shard)
    assert out[0].startswith("rank 0 computes in torch.float32, another rank in another dtype"), out
    assert "set model.dtype=float32 or bfloat16 for the whole cluster" in out[1], out
