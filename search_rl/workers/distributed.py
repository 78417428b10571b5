"""Data parallelism for the workers: process groups (gloo on CPU, NCCL on GPU), FSDP wrapping, collectives.

Every worker of a group holds the whole model on CPU (replicas; gradients are averaged with one ``all_reduce`` per
optimizer step) or a shard of it on GPU (FSDP, which reduce-scatters gradients itself). Both average gradients over
ranks, so ``optimization.TrainableModel`` scales each rank's loss by ``world_size`` times its share of the global
token (or sequence) count, and the update equals a single-process update on the whole mini-batch.

The GPU path (NCCL + FSDP) is written against torch's documented FSDP API but has not run in CI, which has no GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Where a worker sits in its group and how it runs."""

    rank: int
    """This worker's rank, 0 .. world_size - 1."""
    world_size: int
    """Workers in the group."""
    device: str = "cpu"
    """``cpu`` (gloo, replicas) or ``cuda`` (NCCL, FSDP)."""
    torch_threads: int = 1
    """torch intra-op threads of the worker process."""
    seed: int = 0
    """Base seed (initialisation, shuffling)."""

    @property
    def use_fsdp(self) -> bool:
        return self.device == "cuda"

    @property
    def distributed(self) -> bool:
        """Whether a process group is needed (more than one worker, or FSDP)."""
        return self.world_size > 1 or self.use_fsdp


def setup_worker_process(spec: WorkerSpec) -> None:
    """Per-process settings of a worker: offline hub, threads, logging."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, spec.torch_threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if spec.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def release_memory() -> None:
    """Hand freed heap memory back to the OS after a memory-heavy phase (CPU).

    glibc keeps freed blocks, so a worker's resident size would stay at its peak for the rest of the run; the actor
    and the critic peak at different times, and trimming keeps their peaks from adding up on one machine.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def master_address() -> tuple[str, int]:
    """This node's IP and a free TCP port on it (rank 0 hosts the rendezvous)."""
    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests with a local group): loopback
        host = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return host, int(s.getsockname()[1])


def init_process_group(spec: WorkerSpec, host: str, port: int) -> None:
    """Join the group's process group (gloo on CPU, NCCL on GPU); a no-op for a single CPU worker."""
    if not spec.distributed or dist.is_initialized():
        return
    backend = "nccl" if spec.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=spec.rank, world_size=spec.world_size)
    logger.info("rank %d/%d joined the %s group at %s:%d", spec.rank, spec.world_size, backend, host, port)


def broadcast_parameters(model: nn.Module, spec: WorkerSpec) -> None:
    """Make every CPU replica start from rank 0's weights (FSDP syncs module states itself)."""
    if spec.world_size > 1 and not spec.use_fsdp:
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)


def all_reduce_sum(value: float, spec: WorkerSpec) -> float:
    """Sum of a scalar over the group."""
    if spec.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=spec.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def average_gradients(params: list[nn.Parameter], spec: WorkerSpec) -> None:
    """Average gradients over CPU replicas with one flat ``all_reduce`` (FSDP already did it)."""
    if spec.world_size == 1 or spec.use_fsdp:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # one collective instead of one per tensor
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= spec.world_size
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p)
        offset += n


def wrap_fsdp(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Shard ``model`` over the NCCL group with FSDP, one unit per decoder layer (GPU path)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    layer_classes = {type(m) for m in model.modules() if type(m).__name__.endswith("DecoderLayer")}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    mixed = MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=dtype)
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=policy,
        mixed_precision=mixed,
        device_id=torch.cuda.current_device(),
        sync_module_states=True,
        use_orig_params=True,
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside an FSDP wrapper (or the model itself)."""
    return getattr(model, "module", model) if type(model).__name__ == "FullyShardedDataParallel" else model


def full_state_dict(model: nn.Module, spec: WorkerSpec, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, unsharded, on CPU. Under FSDP all ranks must call it; with ``rank0_only`` the
    others get an empty dict (checkpoints), else every rank gets the full weights (engine sync)."""
    if not spec.use_fsdp:
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=rank0_only)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        return dict(model.state_dict())


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], spec: WorkerSpec) -> None:
    """Load an unsharded state dict into a replica or an FSDP model (missing tied weights are allowed)."""
    if spec.use_fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            model.load_state_dict(state)
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(getattr(model, "config", None), "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"checkpoint does not fit the model: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        )
    tie = getattr(model, "tie_weights", None)
    if tied and callable(tie):
        tie()
