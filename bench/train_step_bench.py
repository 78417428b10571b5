"""Step profile of the trainer: GRPO steps of SmolLM2-135M-Instruct on the shipped train split against a real retriever.

Runs ``--steps`` GRPO steps (default 8 prompts x 4 samples, the trainer's default budgets) through the real path
(``main_ppo``: Ray, worker group, ``TrainingLoop``) and prints seconds per step by phase (rollout, of it the wait for
the retriever, reward, old and reference log-probs, actor update, weight sync), throughput (generated tokens/s,
tokens/s of the whole step, the actor update's tokens/s) and peak memory (driver and workers). Then, once the
workers are gone, the limit: a bare torch loop (forward, log-softmax gather, backward, one AdamW step per
mini-batch) over the last step's batch with the same micro-batches and threads; ``update_vs_bare`` is the actor
update's tokens/s over the bare loop's (1.0 = the update costs nothing beyond forward/backward).

    python bench/train_step_bench.py                                  # starts its own BM25 retriever
    python bench/train_step_bench.py --retriever-url http://127.0.0.1:8000 --steps 3

    # the learning benchmark's GRPO step (4 prompts x 4, two mini-batches, its budgets) from a warm start:
    python bench/train_step_bench.py --profile warm-grpo --model runs/ws/sft/global_step_30/actor \
        --retriever-url http://127.0.0.1:8000/retrieve --steps 4 \
        --override actor_rollout_ref.actor.old_logprobs=recompute

Last line: ``train_step_bench step_s=<mean seconds per step> update_vs_bare=<ratio>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from search_rl.batches import TrainBatch
from search_rl.config import PPOConfig
from search_rl.configure import load_config
from search_rl.logging_setup import configure_logging
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.models import load_model
from search_rl.trainer.ppo import PPOStep
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.forward import model_token_count, used_columns

PHASES = (
    "rollout",
    "generate",
    "retrieve",
    "reward",
    "old_log_prob",
    "ref_log_prob",
    "advantages",
    "update_actor",
    "sync_weights",
    "step",
)


class CapturingStep(PPOStep):
    """Keeps the last batch the actor was updated on (for the bare loop)."""

    last_batch: TrainBatch | None = None

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        self.last_batch = batch
        return super().update_actor(batch)


def bare_update(cfg: PPOConfig, batch: TrainBatch, threads: int) -> tuple[float, float]:
    """(tokens, seconds) of plain forward/backward/AdamW over ``batch`` with the trainer's micro/mini-batches."""
    torch.set_num_threads(threads)
    model = load_model(cfg.model.path).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    actor = cfg.actor_rollout_ref.actor
    mini = actor.ppo_mini_batch_size * cfg.n_samples // cfg.trainer.n_workers
    tokens, start = 0, time.perf_counter()
    for mini_batch in batch.split_by_size(mini):
        optimizer.zero_grad(set_to_none=True)
        for micro in mini_batch.split_by_size(actor.ppo_micro_batch_size_per_gpu):
            first, t = used_columns(micro)
            end = micro.prompt_length + t
            logits = (
                model(
                    input_ids=micro.input_ids[:, first:end],
                    attention_mask=micro.attention_mask[:, first:end],
                    position_ids=micro.position_ids[:, first:end],
                    logits_to_keep=t + 1,
                )
                .logits[:, :-1]
                .float()
            )
            logprobs = logits.log_softmax(-1).gather(-1, micro.response_ids[:, :t, None]).squeeze(-1)
            mask = micro.response_mask[:, :t]
            (-(logprobs * mask).sum() / mask.sum().clamp(min=1)).backward()
            tokens += model_token_count(micro)
        optimizer.step()
    return float(tokens), time.perf_counter() - start


def report(history: list[tuple[int, dict[str, float]]]) -> float:
    """Print the per-step table; return the mean step time over the steps after the first (all if only one)."""
    print("\nstep | " + " | ".join(f"{p}_s" for p in PHASES) + " | gen tok/s | step tok/s | update tok/s")
    for step, m in history:
        cells = [f"{m.get(f'timing/{p}_s', 0.0):.1f}" for p in PHASES]
        rates = [m["rollout/gen_tokens_per_s"], m["perf/tokens_per_s"], m["perf/actor_update_tokens_per_s"]]
        print(f"{step} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.0f}" for r in rates))
    for step, m in history:
        print(
            f"step {step}: {m['rollout/turns_mean']:.2f} turns, {m['rollout/searches_mean']:.2f} searches, "
            f"{m['response_length/mean']:.0f} response tokens ({m['response_length/model_tokens_mean']:.0f} model) "
            f"per sample, {m['perf/total_tokens']:.0f} tokens in the batch, reward {m['reward/score_mean']:.3f}"
        )
    times = [m["timing/step_s"] for _, m in history]
    return statistics.mean(times[1:] if len(times) > 1 else times)


WARM_GRPO = (
    "max_turns=2",
    "actor_rollout_ref.rollout.max_turn_tokens=128",
    "actor_rollout_ref.rollout.max_obs_tokens=256",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "reward.partial_credit=f1",
    "reward.partial_credit_weight=0.5",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    f"trainer.torch_threads_per_worker={os.cpu_count() or 1}",
)
"""``--profile warm-grpo``: the GRPO run of ``bench/learning_bench.py`` (its budgets, learning rate, F1 partial
credit, two mini-batches of 2 prompts, every core for the one worker); with ``--prompts 4 --samples 4``."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retriever-url", default=None, help="a running retriever; default: start a BM25 one")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra overrides (repeatable)")
    ap.add_argument("--profile", choices=("default", "warm-grpo"), default="default", help="see the docstring")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare forward/backward loop (e.g. with LoRA)")
    args = ap.parse_args()
    profile: tuple[str, ...] = ()
    if args.profile == "warm-grpo":
        args.prompts, args.samples, profile = 4, 4, WARM_GRPO
    configure_logging()
    out = Path(tempfile.mkdtemp(prefix="train_step_bench-"))
    with contextlib.ExitStack() as stack:
        url = args.retriever_url
        if url is None:
            from retriever_server.launcher import RetrieverProcess, bm25_env

            server = RetrieverProcess(env=bm25_env(out / "index"), log_path=out / "retriever.log")
            url = stack.enter_context(server).url
        cfg = load_config(
            [
                "algorithm=grpo",
                f"model.path={args.model}",
                f"retriever.url={url}",
                f"trainer.default_local_dir={out}",
                f"trainer.total_training_steps={args.steps}",
                "trainer.save_freq=0",
                "trainer.test_freq=0",
                "trainer.dump_rollouts=false",
                "trainer.logger=[console]",
                "trainer.resume=disable",
                f"data.train_batch_size={args.prompts}",
                f"actor_rollout_ref.rollout.n={args.samples}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
                *profile,
                *args.override,
            ]
        )
        history, batch, peaks = run_trainer(cfg)
    threads = cfg.trainer.torch_threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.trainer.n_workers)
    step_s = report(history)
    m = history[-1][1]
    print(f"profile={args.profile} overrides={' '.join(args.override) or '-'}")
    if args.no_bare:
        print(f"train_step_bench step_s={step_s:.1f}")
        return
    assert batch is not None
    tokens, seconds = bare_update(cfg, batch, threads)
    bare_tps = tokens / seconds
    ratio = m["perf/actor_update_tokens_per_s"] / bare_tps
    driver_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nlast step's actor update: {m['perf/actor_update_tokens']:.0f} tokens in {m['timing/update_actor_s']:.1f} s"
        f" = {m['perf/actor_update_tokens_per_s']:.0f} tokens/s; bare forward/backward: {tokens:.0f} tokens in "
        f"{seconds:.1f} s = {bare_tps:.0f} tokens/s ({threads} torch threads)"
    )
    print(
        f"peak memory: workers {', '.join(f'{p:.0f}' for p in peaks)} MiB; driver (incl. bare loop) {driver_mb:.0f} MiB"
    )
    print(
        f"model={cfg.model.path} prompts={args.prompts} samples={args.samples} max_turns={cfg.max_turns} "
        f"workers={cfg.trainer.n_workers} torch={torch.__version__}"
    )
    print(f"train_step_bench step_s={step_s:.1f} update_vs_bare={ratio:.2f}")


def run_trainer(cfg: PPOConfig) -> tuple[list[tuple[int, dict[str, float]]], TrainBatch | None, list[float]]:
    """Run the steps on Ray; return the history, the last batch and the workers' peak memory (MiB)."""
    import ray

    prepared = prepare(cfg)
    ray.init(include_dashboard=False, log_to_driver=False)
    actor, critic = build_workers(cfg, "cpu")
    try:
        trainer = build_trainer(cfg, prepared, actor, critic)
        step = trainer.step_fn
        assert isinstance(step, PPOStep)
        step.__class__ = CapturingStep
        history = trainer.fit()
        peaks = actor.broadcast(ActorRolloutRefWorker.peak_memory_mb)
    finally:
        actor.shutdown()
        ray.shutdown()
    return history, step.last_batch, peaks


if __name__ == "__main__":
    main()
