"""The demo's GRPO batch through one worker: rollout, old log-probs and actor update, timed in one dtype.

One actor worker in this process (world size 1, no Ray) with the demo's RL settings (LoRA r16, 4 prompts x 4
samples of the kept questions, two mini-batches, micro-batches of one sample, 64-token turns, 384-token
observations, two searches) rolls out a batch against a retriever once and saves it (``--batch``); later calls, in
any dtype, reuse it, so both dtypes time the same tokens. Then, ``--repeats`` times: the old log-prob pass (unless
``--old update``: the update computes them, ``old_logprobs=update``) and one actor update (two optimizer steps).
``--profile`` runs the last repeat under ``torch.profiler`` and prints the operators by self time; ``--attn``
sets ``model.attn_implementation``, the attention of the trainer's passes (``sdpa``, the default, or ``eager``; the
engine keeps its own).

    python bench/update_dtype_profile.py --model <warm start>/actor --retriever-url URL --dtype float32
    python bench/update_dtype_profile.py --model <warm start>/actor --dtype bfloat16 --old update

Last line: ``update_dtype_profile dtype=<d> attn=<a> old=<source> rollout_s=<s> old_logprob_s=<s> update_s=<s>``
(the last repeat's; ``rollout_s`` is 0 when the batch was reused).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from retriever_server.settings import DEFAULT_URL
from search_rl.batches import BatchMeta
from search_rl.config import (
    ActorConfig,
    AlgorithmConfig,
    ModelConfig,
    OptimConfig,
    RetrieverClientConfig,
    TrainRolloutConfig,
)
from search_rl.config.model import ATTENTIONS
from search_rl.demo.settings import RL_QUESTIONS, TURN_TOKENS
from search_rl.prompt_data import PromptDataset, read_rows
from search_rl.trainer.steps import build_train_batch, compute_advantages, place_scores
from search_rl.workers import WorkerSpec
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker

PROMPTS, SAMPLES, TURNS, OBS_TOKENS = 4, 4, 2, 384
"""The demo's RL batch and budgets."""


def build_worker(model: str, dtype: str, url: str, threads: int, attn: str = "sdpa") -> ActorRolloutRefWorker:
    """The demo's RL actor on this process (LoRA r16, mini-batches of 2 prompts, no KL term); ``attn``: its
    ``model.attn_implementation``."""
    rollout = TrainRolloutConfig(
        n=SAMPLES,
        engine="hf",
        search_turns=TURNS,
        max_turn_tokens=TURN_TOKENS,
        max_obs_tokens=OBS_TOKENS,
        max_response_tokens=(TURNS + 2) * TURN_TOKENS + TURNS * OBS_TOKENS,
    )
    worker = ActorRolloutRefWorker(
        WorkerSpec(rank=0, world_size=1, device="cpu", torch_threads=threads, seed=0),
        ModelConfig(path=model, dtype=dtype, lora_rank=16, lora_alpha=32, attn_implementation=attn),
        ActorConfig(optim=OptimConfig(lr=1e-4), ppo_mini_batch_size=PROMPTS // 2),
        rollout,
        None,
        AlgorithmConfig(adv_estimator="grpo", use_kl_loss=False),
        RetrieverClientConfig(url=url),
    )
    worker.init_distributed("127.0.0.1", 0)
    return worker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an HF folder: the demo's <run>/sft/global_step_10/actor")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "auto"))
    ap.add_argument("--retriever-url", default=DEFAULT_URL)
    ap.add_argument("--batch", type=Path, default=Path("/tmp/update_dtype_profile_batch.pt"), help="saved batch")
    ap.add_argument("--old", default="batch", choices=("batch", "update"), help="batch: a recompute pass first")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--attn", default="sdpa", choices=ATTENTIONS, help="model.attn_implementation")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    worker = build_worker(args.model, args.dtype, args.retriever_url, threads, args.attn)
    algo = worker.algo
    rollout_s = 0.0
    if not args.batch.exists():
        dataset = PromptDataset(read_rows([str(RL_QUESTIONS)])[:PROMPTS], worker.tokenizer, 512, True)
        prompts = dataset.batch(range(len(dataset))).repeat_interleave(SAMPLES)
        t = time.perf_counter()
        result = worker.generate(prompts, False, 123)
        rollout_s = time.perf_counter() - t
        width = worker.rollout_cfg.max_response_tokens
        batch = build_train_batch(result.trajectories, prompts, worker.tokenizer.pad_token_id, width, BatchMeta(step=1))
        scores = [float(i % 3 == 0) for i in range(len(batch))]  # two rewards per group: every group has signal
        torch.save(batch.replace(token_level_scores=place_scores(batch, scores)), args.batch)
        print(f"rolled out {len(batch)} samples in {rollout_s:.1f} s; saved to {args.batch}", flush=True)
    batch = torch.load(args.batch, weights_only=False)
    tokens = int(batch.response_attention_mask.sum())
    print(f"{args.dtype}: {len(batch)} samples, {tokens} response tokens, {threads} threads", flush=True)
    old_s = update_s = 0.0
    for repeat in range(args.repeats):
        t = time.perf_counter()
        if args.old == "batch":
            batch = batch.replace(old_logprobs=worker.compute_log_prob(batch)[0])
        old_s = time.perf_counter() - t
        ready = compute_advantages(batch, algo, None)[0]
        profiler = None
        if args.profile and repeat == args.repeats - 1:
            from torch.profiler import ProfilerActivity, profile

            profiler = profile(activities=[ProfilerActivity.CPU])
            profiler.__enter__()
        t = time.perf_counter()
        metrics = worker.update_actor(ready, step=1, old_source=args.old)
        update_s = time.perf_counter() - t
        if profiler is not None:
            profiler.__exit__(None, None, None)
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
        print(
            f"repeat {repeat}: old log-probs {old_s:.1f} s, update {update_s:.1f} s, loss {metrics['actor/loss']:.4f}"
        )
    print(
        f"update_dtype_profile dtype={str(worker.compute_dtype).removeprefix('torch.')} "
        f"attn={worker.attn_implementation} old={args.old} "
        f"rollout_s={rollout_s:.1f} old_logprob_s={old_s:.1f} update_s={update_s:.1f}"
    )


if __name__ == "__main__":
    main()
