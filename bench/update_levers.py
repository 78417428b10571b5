"""One actor update and its log-prob passes with and without the speed levers, on the same batch and weights.

The levers (``actor_rollout_ref.actor.*``, docs/training.md "Faster updates"): chunked log-probs
(``logprob_chunk_tokens``), token-budget micro-batches (``ppo_max_token_len_per_gpu``,
``log_prob_max_token_len_per_gpu``) and length-sorted log-prob passes (``log_prob_sort_by_length``). Each is exact,
so loss and gradient norm agree up to the compute dtype's rounding; what changes is time and peak memory.

One worker (world size 1) rolls out a GRPO batch once (no search), then runs, per setting, the old and reference
log-prob passes and one optimizer step over the whole batch at ``LEVER_LR``: the levers off, each alone, then all on.
Every setting starts from the same weights with a fresh AdamW (both restored before it), so its step is AdamW's first
for the gradient it accumulated, which ``gpu_gates.adamw_step_excess`` checks element by element. A warm-up update
runs first. Prints one row per setting as it finishes, then the table.

Run alone (or through ``bench/gpu_check.py --levers``)::

    python bench/update_levers.py --model <HF folder> [--device cpu] [--micro 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "datasets" / "nq_hotpotqa_mini" / "train.parquet"
BENCH = Path(__file__).resolve().parent
LEVER_LR = 1e-4
"""The rows' learning rate: AdamW's first step moves each weight by about this, hundreds of times the step's float32
rounding for weights up to ~1 (``2^-22 |w|``), so a wrong step stands out (``gpu_gates.adamw_step_excess``)."""
AUDIT_CHUNK = 2**24
"""Elements checked at a time (float64 temporaries of ~0.6 GB)."""


@dataclasses.dataclass
class LeverRow:
    """One setting's measurements."""

    name: str
    old_s: float
    ref_s: float
    update_s: float
    update_tokens: float
    loss: float
    grad_norm: float
    peak_gb: float
    step_excess: float = float("nan")
    """How far the row's update lies from AdamW's first step for its gradient, in units of the step's float32 rounding
    (``gpu_gates.adamw_step_excess``; at most 1 for a correct step)."""
    optimizer_steps: int = 0
    """Optimizer steps the row's update took (one mini-batch: 1)."""

    @property
    def update_tok_s(self) -> float:
        return self.update_tokens / self.update_s


def compare_levers(
    model_dir: Path,
    device: str,
    *,
    prompts: int,
    samples: int,
    turn_tokens: int,
    micro: int,
    lora_rank: int = 0,
    chunk_tokens: int = 2048,
    max_tokens: int | None = None,
) -> list[LeverRow]:
    """Rows for the levers off, each alone, and all on (``max_tokens`` None: the update's budget is ``micro`` times
    the mean row's padded length, the log-prob passes' twice that)."""
    import torch

    from search_rl.batches import BatchMeta
    from search_rl.config import (
        ActorConfig,
        AlgorithmConfig,
        ModelConfig,
        OptimConfig,
        RefConfig,
        RetrieverClientConfig,
        TrainRolloutConfig,
    )
    from search_rl.prompt_data import PromptDataset, read_rows
    from search_rl.trainer.steps import build_train_batch, compute_advantages, place_scores
    from search_rl.workers import WorkerSpec
    from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from search_rl.workers.micro_batches import padded_tokens

    gpu = device == "cuda"
    algo = AlgorithmConfig(adv_estimator="grpo", use_kl_loss=True)
    rollout = TrainRolloutConfig(
        n=samples,
        engine="hf",
        search_turns=0,
        max_turn_tokens=turn_tokens,
        max_response_tokens=turn_tokens,
    )
    off = ActorConfig(
        optim=OptimConfig(lr=LEVER_LR),
        ppo_mini_batch_size=prompts,
        ppo_micro_batch_size_per_gpu=micro,
        shuffle=False,
        log_prob_sort_by_length=False,
    )
    rollout.log_prob_micro_batch_size_per_gpu = micro
    worker = ActorRolloutRefWorker(
        WorkerSpec(rank=0, world_size=1, device=device, seed=0),
        ModelConfig(path=str(model_dir), dtype="bfloat16" if gpu else "float32", lora_rank=lora_rank),
        off,
        rollout,
        RefConfig(log_prob_micro_batch_size_per_gpu=micro),
        algo,
        RetrieverClientConfig(url="http://127.0.0.1:9"),  # never called: no search
    )
    worker.init_distributed("127.0.0.1", 0)
    dataset = PromptDataset(read_rows([str(DATA)])[:prompts], worker.tokenizer, 512, True)
    batch_prompts = dataset.batch(range(len(dataset))).repeat_interleave(samples)
    result = worker.generate(batch_prompts, False, 123)
    pad = worker.tokenizer.pad_token_id
    batch = build_train_batch(result.trajectories, batch_prompts, pad, turn_tokens, BatchMeta(step=1))
    batch = batch.replace(token_level_scores=place_scores(batch, [float(i % 3 == 0) for i in range(len(batch))]))
    batch = batch.replace(
        old_logprobs=worker.compute_log_prob(batch)[0], ref_logprobs=worker.compute_ref_log_prob(batch)
    )
    batch = compute_advantages(batch, algo, None)[0]
    if max_tokens is None:
        max_tokens = max(padded_tokens(batch.select(torch.tensor([i]))) for i in range(len(batch)))
        max_tokens = max(max_tokens, math.ceil(micro * padded_tokens(batch) / len(batch)))
    on = dataclasses.replace(
        off,
        logprob_chunk_tokens=chunk_tokens,
        ppo_max_token_len_per_gpu=max_tokens,
        log_prob_max_token_len_per_gpu=2 * max_tokens,
        log_prob_sort_by_length=True,
    )
    print(
        f"levers on: chunk {chunk_tokens} tokens, update budget {max_tokens} tokens, log-prob budget "
        f"{2 * max_tokens}, sorted log-prob passes; {len(batch)} samples",
        flush=True,
    )
    settings = (
        ("warm-up", off),
        ("off", off),
        ("chunked log-probs", dataclasses.replace(off, logprob_chunk_tokens=chunk_tokens)),
        (
            "token budgets",
            dataclasses.replace(
                off, ppo_max_token_len_per_gpu=max_tokens, log_prob_max_token_len_per_gpu=2 * max_tokens
            ),
        ),
        ("sorted log-prob passes", dataclasses.replace(off, log_prob_sort_by_length=True)),
        ("all on", on),
    )
    audit = StepAudit(worker, off.optim.lr, off.optim.weight_decay)
    rows = []
    for name, cfg in settings:
        worker.actor_cfg = cfg
        audit.restore()
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        worker.compute_log_prob(batch)
        t1 = time.perf_counter()
        worker.compute_ref_log_prob(batch)
        t2 = time.perf_counter()
        metrics = worker.update_actor(batch, step=1)
        if gpu:
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
        rows.append(
            LeverRow(
                name,
                t1 - t0,
                t2 - t1,
                t3 - t2 - audit.seconds,
                metrics["perf/actor_update_tokens"],
                metrics["actor/loss"],
                metrics["actor/grad_norm"],
                peak,
                audit.excess,
                audit.steps,
            )
        )
        print(f"done: {format_row(rows[-1])}", flush=True)  # kept if a time limit stops the rest
    audit.close()
    return rows[1:]


class StepAudit:
    """Holds the weights every row starts from (on CPU) and checks each row's optimizer step against AdamW's first
    step for the gradient present at it (``gpu_gates.adamw_step_excess``, from a step post-hook, ``AUDIT_CHUNK``
    elements at a time: no second copy of the weights or gradients on the device). ``seconds``: the check's own time,
    which the row's update time leaves out."""

    def __init__(self, worker: Any, lr: float, weight_decay: float) -> None:
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        from gpu_gates import adamw_step_excess

        self.check_step = adamw_step_excess
        self.optimizer, self.params = worker.trainable.optimizer, worker.trainable.params
        self.lr, self.weight_decay = lr, weight_decay
        self.start = [_local(p).detach().to("cpu", copy=True) for p in self.params]
        self.excess, self.steps, self.seconds = float("nan"), 0, 0.0
        self.hooks = [
            self.optimizer.register_step_pre_hook(self._count),
            self.optimizer.register_step_post_hook(self._check),
        ]

    def restore(self) -> None:
        """The starting weights back and a fresh AdamW (no moments, step 0) for the next row."""
        import torch

        with torch.no_grad():
            for p, w in zip(self.params, self.start, strict=True):
                _local(p).copy_(w)
        self.optimizer.state.clear()
        self.excess, self.steps, self.seconds = float("nan"), 0, 0.0

    def _count(self, *_: Any) -> None:
        self.steps += 1

    def _check(self, *_: Any) -> None:
        if self.steps != 1:  # a second step starts from the first's weights: the row fails on its step count
            return
        t0 = time.perf_counter()
        worst = 0.0
        for p, start in zip(self.params, self.start, strict=True):
            after = _local(p).detach().reshape(-1)
            # AdamW leaves a parameter without a gradient as it was: a step at lr 0
            grad, lr = (_local(p.grad).reshape(-1), self.lr) if p.grad is not None else (after * 0, 0.0)
            for i in range(0, after.numel(), AUDIT_CHUNK):
                part = slice(i, i + AUDIT_CHUNK)
                before = start.reshape(-1)[part].to(after.device)
                worst = max(worst, self.check_step([before], [after[part]], [grad[part]], lr, self.weight_decay))
        self.excess = worst
        self.seconds = time.perf_counter() - t0

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()


def _local(t: Any) -> Any:
    """A tensor's local shard (FSDP2 on one rank: the whole tensor)."""
    return getattr(t, "to_local", lambda: t)()


def format_row(r: LeverRow) -> str:
    """One table row: name | old | ref | update seconds | update tok/s | loss | grad norm | peak GB."""
    return (
        f"{r.name} | {r.old_s:.2f} | {r.ref_s:.2f} | {r.update_s:.2f} | {r.update_tok_s:.0f} | {r.loss:.6g}"
        f" | {r.grad_norm:.6g} | {r.peak_gb:.2f}"
    )


def print_rows(rows: list[LeverRow]) -> None:
    """The comparison table and the relative differences of loss and gradient norm."""
    print("levers | old log-prob s | ref log-prob s | update s | update tok/s | loss | grad norm | peak GB")
    for r in rows:
        print(format_row(r))
    off, on = rows[0], rows[-1]
    loss_diff = abs(on.loss - off.loss) / max(abs(off.loss), 1e-12)
    norm_diff = abs(on.grad_norm - off.grad_norm) / max(abs(off.grad_norm), 1e-12)
    print(
        f"levers: loss rel diff {loss_diff:.2e}, grad norm rel diff {norm_diff:.2e}, "
        f"update {on.update_tok_s / off.update_tok_s:.2f}x, log-prob passes "
        f"{(off.old_s + off.ref_s) / max(on.old_s + on.ref_s, 1e-9):.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="an HF model folder with its tokenizer")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=None, help="the update's token budget (default: see above)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    rows = compare_levers(
        args.model,
        args.device,
        prompts=args.prompts,
        samples=args.samples,
        turn_tokens=args.turn_tokens,
        micro=args.micro,
        lora_rank=args.lora_rank,
        chunk_tokens=args.chunk_tokens,
        max_tokens=args.max_tokens,
    )
    print_rows(rows)


if __name__ == "__main__":
    main()
