"""Data parallelism for the workers, one code path on every device: FSDP2 (``fully_shard``) over a process group,
gloo on CPU (what CI runs), NCCL on GPU. The device is the only difference.

- Parameters and optimizer state are fp32 (the master copy); forward and backward run in the compute dtype
  (``model.dtype``; ``auto``: ``bfloat16`` on GPUs and CPUs with AMX or AVX512-BF16, ``float32`` on other CPUs,
  ``models.compute_dtype``) through FSDP2's ``MixedPrecisionPolicy``, and
  gradients are reduced in fp32. A bf16 master copy would swallow small updates: at lr 1e-6 an AdamW step on bf16
  weights near 0.02 is below bf16's rounding step and changes nothing.
- FSDP2 averages gradients over ranks, so ``optimization.TrainableModel`` scales each rank's loss by
  ``world_size`` times its share of the global token (or sequence) count, and the update equals a single-process
  update on the whole mini-batch.
- Whole weights leave the shards only through ``full_state_dict`` (DCP's ``get_model_state_dict``), for the rollout
  engine, exports and checkpoints; checkpoints are unsharded, so a run saved by N ranks resumes on M.
- Every forward pass all-gathers parameters across the group, so every rank must run the same number of them:
  ``matched_passes`` pads a rank with fewer micro-batches with passes whose results are dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from search_rl.logging_setup import configure_logging

logger = logging.getLogger(__name__)

T = TypeVar("T")

RENDEZVOUS_TIMEOUT_S = 300.0
"""Longest wait for every rank to join the group."""


@dataclass(frozen=True)
class WorkerSpec:
    """Where a worker sits in its group and how it runs."""

    rank: int
    """This worker's rank, 0 .. world_size - 1."""
    world_size: int
    """Workers in the group."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL); both shard with FSDP2."""
    torch_threads: int = 1
    """torch intra-op threads of the worker process."""
    seed: int = 0
    """Base seed (initialisation, shuffling)."""

    @property
    def backend(self) -> str:
        """The process group's backend: ``nccl`` on GPU, ``gloo`` on CPU."""
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def torch_device(self) -> torch.device:
        """The device this worker computes on."""
        return torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")


def setup_worker_process(spec: WorkerSpec) -> None:
    """Per-process settings of a worker: offline hub, threads, logging, GPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, spec.torch_threads))
    configure_logging()
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


# --- rendezvous -------------------------------------------------------------------------------------------------

_STORE: dist.TCPStore | None = None
"""Rank 0's rendezvous store, created by ``master_address`` and kept until the group is up."""


def node_address() -> str:
    """This node's IP as Ray sees it (reachable from the other nodes), or loopback outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    return "127.0.0.1"


def master_address() -> tuple[str, int]:
    """Open rank 0's rendezvous store on this node and return where the other ranks find it.

    The store binds its port here and keeps it, so no other process can take the port between choosing it and
    the group's start (picking a free port, closing it and binding it again later is a race on a busy machine).
    """
    global _STORE
    host = node_address()
    for attempt in range(5):
        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        try:
            _STORE = dist.TCPStore(
                host,
                port,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S),
                use_libuv=True,
            )
            return host, port
        except (RuntimeError, OSError) as e:  # the port was taken meanwhile: another one
            logger.warning("rendezvous port %d unavailable (%s); retrying (%d)", port, e, attempt + 1)
            time.sleep(0.1 * (attempt + 1))
    raise RuntimeError(f"could not open a rendezvous port on {host} after 5 attempts")


def init_process_group(spec: WorkerSpec, host: str, port: int) -> None:
    """Join the group's process group (gloo on CPU, NCCL on GPU), also for a single worker: FSDP2 shards over it."""
    global _STORE
    if dist.is_initialized():
        return
    if spec.backend == "gloo" and host.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # all ranks on this machine: don't let gloo guess an interface
    timeout = datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if spec.rank == 0:  # the store ``master_address`` opened, or one on (host, port); port 0 = any free port
        store = _STORE or dist.TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timeout, use_libuv=True
        )
        _STORE = None
    else:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout, use_libuv=True)
    kwargs: dict[str, Any] = {}
    if spec.device == "cuda":
        kwargs["device_id"] = spec.torch_device
    dist.init_process_group(
        spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timeout, **kwargs
    )
    dist.barrier()
    logger.info(
        "rank %d/%d on node %s joined the %s group at %s:%d",
        spec.rank,
        spec.world_size,
        ray_node_id(),
        spec.backend,
        host,
        port,
    )


def ray_node_id() -> str:
    """The Ray node this process runs on (``-`` outside Ray)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else "-"
    except ImportError:
        return "-"


# --- sharding ---------------------------------------------------------------------------------------------------


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``model`` (one FSDP2 unit each): modules whose class name ends in DecoderLayer."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def shard(model: nn.Module, spec: WorkerSpec, compute_dtype: torch.dtype) -> nn.Module:
    """Shard ``model`` over the group with FSDP2, one unit per decoder layer plus the root, in place.

    ``model``'s parameters keep their dtype (fp32 for a trained model: the master copy); when ``compute_dtype``
    differs, forward and backward run in it and gradients are reduced in fp32.

    Raises:
        ValueError: the ranks compute in different dtypes (``model.dtype=auto`` resolved on nodes of different kinds).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_same_dtype(compute_dtype, spec)
    model.to(spec.torch_device)
    mesh = init_device_mesh(spec.torch_device.type, (spec.world_size,))
    param_dtype = next(model.parameters()).dtype
    policy = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype != param_dtype
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _check_same_dtype(compute_dtype: torch.dtype, spec: WorkerSpec) -> None:
    """Every rank computes in ``compute_dtype``: FSDP2 all-gathers the parameters in it, so ranks that resolved
    ``model.dtype=auto`` differently (an AMX node beside an AVX2 one) would exchange tensors of different types."""
    code = _DTYPE_CODES.index(compute_dtype) if compute_dtype in _DTYPE_CODES else len(_DTYPE_CODES)
    if all_reduce_max(code, spec) != -all_reduce_max(-code, spec):
        raise ValueError(
            f"rank {spec.rank} computes in {compute_dtype}, another rank in another dtype (model.dtype=auto resolves "
            "per node: their CPUs or GPUs differ); set model.dtype=float32 or bfloat16 for the whole cluster"
        )


_DTYPE_CODES = (torch.float32, torch.bfloat16, torch.float16)


def full_state_dict(model: nn.Module, *, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded ``model``, unsharded; all ranks must call it. With ``rank0_only`` the tensors go to
    rank 0's CPU and the other ranks get ``{}`` (checkpoints); else every rank gets them on its device (engines)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    state = get_model_state_dict(model, options=options)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load an unsharded state dict (any rank count wrote it) into a sharded ``model``; every rank passes it.

    Raises:
        ValueError: a name is missing or unexpected (tied aliases may be absent: they load through their tensor).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from search_rl.models.weights import tensor_aliases

    aliases = tensor_aliases(model)
    state = dict(state)
    for alias, canonical in aliases.items():  # a tied name absent from the file: the canonical tensor serves it
        if alias not in state and canonical in state:
            state[alias] = state[canonical]
    expected = set(model.state_dict().keys())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    full: dict[str, Any] = state
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=True))


# --- collectives ------------------------------------------------------------------------------------------------


def _all_reduce_scalar(value: float, spec: WorkerSpec, op: dist.ReduceOp.RedOpType, dtype: torch.dtype) -> float:
    if spec.world_size == 1:
        return value
    t = torch.tensor([value], dtype=dtype, device=spec.torch_device)
    dist.all_reduce(t, op=op)
    return float(t.item())


def all_reduce_sum(value: float, spec: WorkerSpec) -> float:
    """Sum of a scalar over the group."""
    return _all_reduce_scalar(value, spec, dist.ReduceOp.SUM, torch.float64)


def all_reduce_max(value: int, spec: WorkerSpec) -> int:
    """Largest integer over the group."""
    return int(_all_reduce_scalar(value, spec, dist.ReduceOp.MAX, torch.int64))


def matched_passes(parts: Sequence[T], spec: WorkerSpec) -> Iterator[tuple[T, bool]]:
    """``(part, real)`` for each of this rank's ``parts``, then ``(parts[-1], False)`` until every rank has made as
    many passes as the rank with the most parts (sharded forwards are collectives). Callers drop unreal results.

    Raises:
        ValueError: a rank has no part while others have some (it would have nothing to pad with).
    """
    longest = all_reduce_max(len(parts), spec)
    if longest and not parts:
        raise ValueError(f"rank {spec.rank} has no micro-batch while another rank has {longest}")
    for i in range(longest):
        yield (parts[i], True) if i < len(parts) else (parts[-1], False)
