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
from numerics import head_inputs, logprob_scale
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
    n=2, engine="hf", search_turns=1, max_turn_tokens=16, max_obs_tokens=96, max_response_tokens=96
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
    attn: str = "sdpa",
    **actor_options: Any,
) -> ActorRolloutRefWorker:
    """The tiny-model actor (policy + HF engine + reference) of one rank; the group is not joined yet.
    ``actor_options``: further ``ActorConfig`` fields (``shuffle`` defaults to off)."""
    actor_options.setdefault("shuffle", False)
    return ActorRolloutRefWorker(
        WorkerSpec(rank=rank, world_size=world, device=device, torch_threads=1, seed=0),
        ModelConfig(path="tiny", dtype=dtype, lora_rank=lora_rank, attn_implementation=attn),
        ActorConfig(
            optim=OptimConfig(lr=lr),
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size_per_gpu=micro,
            share_prompts=share_prompts,
            **actor_options,
        ),
        ROLLOUT,
        RefConfig(),
        ALGO,
        RetrieverClientConfig(url="http://127.0.0.1:9"),  # never called: the random model never writes a valid search
    )


def make_critic(
    rank: int = 0, world: int = 1, *, lr: float = 1e-2, dtype: str = "float32", attn: str = "sdpa"
) -> CriticWorker:
    """The tiny-model critic of one rank; the group is not joined yet."""
    return CriticWorker(
        WorkerSpec(rank=rank, world_size=world, torch_threads=1),
        ModelConfig(path="tiny", dtype=dtype, attn_implementation=attn),
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


def response_logprob_scale(
    model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0, entropy: bool = False
) -> float:
    """``numerics.logprob_scale`` of ``batch``'s response tokens under ``model`` (plain or FSDP2-sharded), from the
    output head's inputs at the positions that predict them (one row at a time: no batch of vocabulary logits)."""
    head = model.get_output_embeddings()
    p, t = batch.prompt_length, batch.response_ids.shape[1]
    rows = []
    for i in range(len(batch)):
        row = batch.select(torch.tensor([i]))
        inputs = {"input_ids": row.input_ids, "attention_mask": row.attention_mask, "position_ids": row.position_ids}
        hidden = head_inputs(model, head, **inputs)[0, p - 1 : p - 1 + t]  # (T, H): position p - 1 + k predicts k
        rows.append(hidden[row.response_attention_mask[0].bool()])
    return logprob_scale(torch.cat(rows), whole(head.weight), temperature, entropy)


class GradientTerms:
    """The sum of the absolute terms behind each weight-gradient entry, the ``scale`` of ``assert_reordered_close``
    for gradients (tests/numerics.py): a gradient sums per-token terms of both signs (advantages, log-prob
    derivatives), which cancel, so its rounding is of ``sum |terms|``, not of its value.

    Hooks on the modules that own trainable weights add, at every backward pass through them: for a linear layer's
    weight ``sum_t |d_t| |x_t|^T`` (``d_t`` the gradient at its output, ``x_t`` its input; its bias ``sum_t |d_t|``),
    for an RMSNorm weight ``sum_t |d_t * xhat_t|`` (``xhat_t`` the normalised input). That is the last reduction of a
    weight gradient, over the tokens; the reductions before it (in ``d_t`` and ``x_t``) enter to first order, which
    the bound's worst case (``n`` where roundings grow like ``sqrt(n)``) covers. An embedding row's last reduction
    runs over its token's occurrences, often one, and leaves no such slack for the gradient it sums, the residual
    stream's, whose components add every layer's contribution and cancel to below their vector's scale: a row adds
    ``|d_t| + max|d_t|`` for each of its tokens (with ``|d_t|`` alone, untied embedding rows of the chunked log-prob
    test differed by up to 37 times the bound). Tied weights (the head and the embedding) add both uses. Clipping
    scales the gradient, not these sums: a bound from them holds for the clipped gradient too.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        canonical: dict[int, str] = {}  # a tied tensor's first name, as named_parameters() lists it
        for name, param in model.named_parameters(remove_duplicate=False):
            canonical.setdefault(id(param), name)
        self.names = [name for name, param in model.named_parameters() if param.requires_grad]
        self.sums: dict[str, torch.Tensor] = {}
        self.handles = []
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or type(module).__name__.endswith("RMSNorm"):
                owned = [getattr(module, k, None) for k in ("weight", "bias")]
                keys = tuple(
                    canonical[id(t)] if isinstance(t, torch.Tensor) and t.requires_grad else None for t in owned
                )
                if keys[0] is not None:
                    self.handles.append(module.register_forward_hook(self._hook(keys)))

    def take(self) -> list[torch.Tensor]:
        """The sums since the last ``take``, one per trainable parameter in ``model.parameters()`` order (the
        optimizer's), on CPU in float64; then start again from zero."""
        sums = [self.sums.get(name, torch.zeros((), dtype=torch.float64)).cpu() for name in self.names]
        self.sums = {}
        return sums

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _add(self, key: str | None, value: torch.Tensor) -> None:
        if key is not None:
            self.sums[key] = self.sums.get(key, 0) + value

    def _hook(self, keys: tuple[str | None, ...]) -> Callable[..., None]:
        weight_key, bias_key = keys

        def on_forward(module: torch.nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            if not output.requires_grad:
                return
            if isinstance(module, torch.nn.Linear) and output.shape[-1] != module.out_features:
                return  # a forward swapped in (chunked log-probs' head): its uses are not counted
            x = inputs[0].detach()

            def on_grad(grad: torch.Tensor) -> None:
                d = grad.detach().double().abs().reshape(-1, grad.shape[-1])  # (tokens, out)
                if isinstance(module, torch.nn.Linear):
                    self._add(weight_key, d.T @ x.double().abs().reshape(-1, x.shape[-1]))
                    self._add(bias_key, d.sum(0))
                elif isinstance(module, torch.nn.Embedding):  # |d_t| and the scale of its vector (the docstring)
                    rows = torch.zeros(module.num_embeddings, d.shape[1], dtype=torch.float64, device=d.device)
                    self._add(weight_key, rows.index_add_(0, x.reshape(-1), d + d.amax(-1, keepdim=True)))
                else:  # RMSNorm: weight * x / rms(x)
                    xd = x.double()
                    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
                    xhat = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).reshape(-1, x.shape[-1])
                    self._add(weight_key, (d * xhat.abs()).sum(0))

            output.register_hook(on_grad)

        return on_forward


class StepCapture:
    """Each optimizer step's gradients (whole, on CPU) and their ``GradientTerms`` sums, appended in the optimizer's
    parameter order at every step; a step's sums cover only that step's passes (``GradientTerms.take``). ``check``:
    assert they cover the gradients (``assert_terms_cover``; not where chunked log-probs replace the head's forward)."""

    def __init__(self, worker: Any, check: bool = True) -> None:
        trainable = worker.trainable
        self.grads: list[torch.Tensor] = []
        self.terms: list[torch.Tensor] = []
        self.counter, self.check = GradientTerms(worker.module), check
        trainable.optimizer.register_step_pre_hook(lambda *_: self._capture(trainable.params))

    def _capture(self, params: list[torch.nn.Parameter]) -> None:
        grads, terms = [whole(p.grad) for p in params], self.counter.take()
        if self.check:
            assert_terms_cover(grads, terms)
        self.grads.extend(grads)
        self.terms.extend(terms)


def assert_terms_cover(grads: list[torch.Tensor], terms: list[torch.Tensor]) -> None:
    """Assert no gradient entry exceeds its ``GradientTerms`` sum (a sum of ``|terms|`` is never below ``|their
    sum|``): every use of every weight was counted."""
    for i, (g, t) in enumerate(zip(grads, terms, strict=True)):
        assert bool((g.double().abs() <= t * (1 + 1e-5) + 1e-30).all()), f"parameter {i}: gradient above its terms"


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


def engine_view(actor: ActorRolloutRefWorker, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What ``actor``'s rollout engine serves: its weights and its float32 logits for ``ids`` (1, L), on CPU."""
    assert actor.engine_model is not None
    weights = {k: v.detach().cpu().clone() for k, v in actor.engine_model.state_dict().items()}
    with torch.no_grad():
        logits = actor.engine_model(input_ids=ids.to(actor.spec.torch_device)).logits.float().cpu()
    return weights, logits


def assert_engine_serves_policy(
    actor: ActorRolloutRefWorker, ids: torch.Tensor, stale: tuple[dict[str, torch.Tensor], torch.Tensor]
) -> None:
    """Assert the rollout engine serves the policy's current weights, where an engine that missed the sync (still
    serving ``stale``, its ``engine_view`` before the update) would fail.

    - Weights: every engine tensor is the policy's float32 master cast to the compute dtype, bit for bit (the sync is
      that cast and nothing else), and more than half of them differ from the stale engine's.
    - Logits for ``ids``: both forwards run those same weights; each kernel accumulates in float32 in its own order and
      rounds its output to the compute dtype, so the two may round an activation to neighbouring values, one step of
      that dtype apart (its ``eps``, 2^-7 in bf16, relative). A logit carries the roundings on its path, 4 a layer
      (attention, its output projection, the MLP, its down projection) and the head's, which the RMS-normalised
      layers pass on at about their size: the logits agree within ``(4 * layers + 1) * eps * M`` (``M`` the largest
      |logit|; measured on CPU in bf16, tiny model: one step, 3.9e-3, against 0.064). The stale engine's logits
      must lie beyond that bound: an update too small to move the served logits (at lr 1e-6 only 4% of the bf16
      weights change and the stale logits are one step off, as a synced engine's) cannot tell the two apart.
    """
    assert actor.engine_model is not None
    stale_weights, stale_logits = stale
    served, logits = engine_view(actor, ids)
    policy = {k: whole(v) for k, v in actor.module.state_dict().items()}
    dtype = actor.engine_model.dtype
    unsynced = [k for k, v in served.items() if k not in policy or not torch.equal(v, policy[k].to(dtype))]
    assert not unsynced, f"engine tensors that are not the policy's weights in {dtype}: {unsynced[:5]}"
    moved = sum(int((served[k] != stale_weights[k]).sum()) for k in served)
    total = sum(v.numel() for v in served.values())
    assert moved > total / 2, f"the update moved {moved} of {total} {dtype} weights: a stale engine would pass"
    with torch.no_grad():
        policy_logits = actor.module(input_ids=ids.to(actor.spec.torch_device)).logits.float().cpu()
    layers = actor.engine_model.config.num_hidden_layers
    bound = (4 * layers + 1) * torch.finfo(dtype).eps * float(policy_logits.abs().max())
    synced_gap = float((logits - policy_logits).abs().max())
    stale_gap = float((stale_logits - policy_logits).abs().max())
    assert synced_gap <= bound, f"engine logits {synced_gap:.3g} from the policy's, bound {bound:.3g}"
    assert stale_gap > bound, f"stale engine logits only {stale_gap:.3g} from the policy's (bound {bound:.3g})"


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
    entries (the children do), so this folder, ``tests/`` and the repository go in through ``PYTHONPATH`` while it
    starts."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(FORKSERVER_PRELOAD)
    here = Path(__file__).resolve().parent
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(here.parents[1]), str(here.parents[2]), *([saved] if saved else [])]
    )
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
