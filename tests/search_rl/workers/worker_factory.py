"""Shared by the worker tests (imported by name, also inside spawned rank processes): the tiny actor and critic,
a real rollout batch, and whole (unsharded) views of sharded tensors."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from transformers import PreTrainedTokenizerBase

from search_rl.batches import BatchMeta, TrainBatch
from search_rl.config import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
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
from search_rl.workers.critic import CriticWorker

ALGO = AlgorithmConfig(adv_estimator="grpo", use_kl_loss=True, entropy_coeff=0.01)
ROLLOUT = TrainRolloutConfig(
    n=2, engine="hf", max_turns=1, max_turn_tokens=16, max_obs_tokens=96, max_response_tokens=96
)


def make_actor(
    micro: int = 2,
    mini: int = 4,
    rank: int = 0,
    world: int = 1,
    *,
    lr: float = 1e-3,
    dtype: str = "float32",
    device: str = "cpu",
    lora_rank: int = 0,
    share_prompts: bool = True,
    **actor_options: Any,
) -> ActorRolloutRefWorker:
    """The tiny-model actor (policy + HF engine + reference) of one rank; the group is not joined yet.
    ``actor_options``: further ``ActorConfig`` fields."""
    return ActorRolloutRefWorker(
        WorkerSpec(rank=rank, world_size=world, device=device, torch_threads=1, seed=0),
        ModelConfig(path="tiny", dtype=dtype, lora_rank=lora_rank),
        ActorConfig(
            optim=OptimConfig(lr=lr),
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size_per_gpu=micro,
            shuffle=False,
            share_prompts=share_prompts,
            **actor_options,
        ),
        ROLLOUT,
        RefConfig(),
        ALGO,
        RetrieverClientConfig(url="http://127.0.0.1:9"),  # never called: the random model never writes a valid search
    )


def make_critic(rank: int = 0, world: int = 1, *, lr: float = 1e-2, dtype: str = "float32") -> CriticWorker:
    """The tiny-model critic of one rank; the group is not joined yet."""
    return CriticWorker(
        WorkerSpec(rank=rank, world_size=world, torch_threads=1),
        ModelConfig(path="tiny", dtype=dtype),
        CriticConfig(optim=OptimConfig(lr=lr), ppo_mini_batch_size=4),
        ALGO,
        n_samples=2,
    )


def build_rollout_batch(tokenizer: PreTrainedTokenizerBase) -> TrainBatch:
    """8 samples (4 prompts x 2) from the tiny model: random turns, invalid-action feedback inserted with mask 0,
    scored, with old and reference log-probs and GRPO advantages."""
    worker = make_actor()
    worker.init_distributed("127.0.0.1", 0)
    prompts = PromptDataset(read_rows(["data/datasets/nq_hotpotqa_mini/train.parquet"])[:4], tokenizer, 512, False)
    batch_prompts = prompts.batch(range(4)).repeat_interleave(2)
    result = worker.generate(batch_prompts, False, 123)
    batch = build_train_batch(result.trajectories, batch_prompts, tokenizer.pad_token_id, 96, BatchMeta(step=1))
    scores = [float(i % 3 == 0) for i in range(8)]
    batch = batch.replace(token_level_scores=place_scores(batch, scores))
    old, _ = worker.compute_log_prob(batch)
    batch = batch.replace(old_logprobs=old, ref_logprobs=worker.compute_ref_log_prob(batch))
    return compute_advantages(batch, ALGO, None)[0]


def gradient_terms(batch: TrainBatch) -> int:
    """The terms summed into one weight-gradient entry (one per real token of ``batch``), for the reordering bounds
    of ``tests/numerics.py``; also what the loss and other per-token means sum."""
    return int(batch.attention_mask.sum())


def logprob_terms(batch: TrainBatch) -> int:
    """The longest reduction feeding one log-prob, entropy or value of ``batch``: attention over its columns (the
    tiny model's hidden and MLP widths are shorter, and the vocabulary's log-sum-exp is pairwise-summed, so its
    rounding grows with log2 of the vocabulary, not with its size)."""
    return int(batch.attention_mask.shape[1])


ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
"""``torch.optim.AdamW``'s defaults, which the workers keep."""


def adamw_move(grad: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor] | None, step: int, lr: float):
    """What AdamW's step ``step`` (1-based) subtracts for ``grad``, weight decay aside, in float64, and the same with
    the first moment's terms summed in absolute value (the size its float32 rounding scales with: the new gradient
    and the old moment can cancel); ``moments``: ``(exp_avg, exp_avg_sq)`` after the steps before (None on the
    first)."""
    (b1, b2), g = ADAM_BETAS, grad.double()
    m_prev, v_prev = moments if moments is not None else (torch.zeros_like(g), torch.zeros_like(g))
    m = b1 * m_prev.double() + (1 - b1) * g
    m_terms = b1 * m_prev.double().abs() + (1 - b1) * g.abs()
    v = b2 * v_prev.double() + (1 - b2) * g * g
    scale = lr / (1 - b1**step) / ((v / (1 - b2**step)).sqrt() + ADAM_EPS)
    return m * scale, m_terms * scale


def assert_same_adamw_step(after, expected_after, grads, expected_grads, lr: float, step: int = 1, moments=None):
    """Assert two AdamW steps from the same weights and moments, taken with gradients that differ by rounding, moved
    each weight as Adam moves it for those two gradients: ``|adamw_move(g) - adamw_move(h)|`` apart, plus the
    update's float32 roundings (~10, of the size of its terms, in each run) and the last one of ``w - move``.

    Raw weights cannot share one tolerance: Adam divides by ``sqrt(v) + eps``, so where a gradient is near ``eps``
    (1e-8) a last-bit difference moves the weight by a good part of ``lr`` (2.2e-5 at lr 1e-2 was seen on a CPU
    with AMX), and where it changes sign by up to ``2 * lr``. The gradients themselves are compared by the caller;
    this checks that the step applied them. ``moments``: per parameter, as for ``adamw_move``.
    """
    eps32 = torch.finfo(torch.float32).eps
    for i, (w, w_ref, g, g_ref) in enumerate(zip(after, expected_after, grads, expected_grads, strict=True)):
        state = moments[i] if moments is not None else None
        (move, size), (move_ref, size_ref) = adamw_move(g, state, step, lr), adamw_move(g_ref, state, step, lr)
        bound = (move - move_ref).abs() + 10 * eps32 * (size + size_ref) + eps32 * w_ref.double().abs()
        diff = (w.double() - w_ref.double()).abs()
        off = diff > bound
        worst = float((diff - bound)[off].max()) if off.any() else 0.0
        assert not off.any(), f"parameter {i}: {int(off.sum())} weights moved otherwise than Adam would, by {worst:.3g}"


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a (possibly FSDP2-sharded) parameter or gradient, detached, on CPU."""
    full = getattr(t, "full_tensor", None)
    return (full() if callable(full) else t).detach().cpu().clone()


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FORKSERVER_PRELOAD = ["torch", "transformers", "worker_factory", "search_rl.workers.distributed"]
"""Imported once by the fork server, so each rank process starts in about a second instead of importing torch,
transformers and the trainer anew (a spawned rank took 5-10 s on 2 cores)."""


def _start_fork_server() -> None:
    """Start the fork server (once per process) with the preload importable: it does not get pytest's ``sys.path``
    entries (the children do), so this folder and the repository go in through ``PYTHONPATH`` while it starts."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(FORKSERVER_PRELOAD)
    here = Path(__file__).resolve().parent
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parents[2]), *([saved] if saved else [])])
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def run_two_ranks(target: Callable[..., None], *args: Any, timeout_s: float = 300) -> dict:
    """Run ``target(rank, port, out, *args)`` on two gloo ranks (child processes started from a fork server that has
    torch and the trainer imported, never forked from this process's Ray or torch threads); return the dict the
    ranks filled."""
    ctx = mp.get_context("forkserver")
    _start_fork_server()
    with ctx.Manager() as manager:
        out = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=target, args=(rank, port, out, *args)) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout_s)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return dict(out)
