"""Weight updates into a running ``vllm.LLM``, without pickled closures (vLLM >= 0.32).

Two ways, chosen by ``rollout.vllm.weight_sync`` (``resolve_weight_sync``):

- ``disk`` (CPU, or anywhere): the tensors are written as one safetensors file into a fresh folder under /dev/shm
  (memory, not disk), and every vLLM worker reloads it in place with ``reload_weights(weights_path=...)`` through
  ``WorkerExtension.search_rl_reload_weights`` (an RPC by method name; ``vllm.LLM(worker_extension_cls=...)``).
  The CPU backend repacks each linear layer's weight for its GEMM kernel after loading; a tied ``lm_head`` shares
  the embedding's tensor but keeps its own packed copy, which vLLM's layer-wise reload does not redo, so the
  extension re-runs the processing of every layer whose weight belongs to another module.
- ``ipc`` / ``nccl`` (GPU): vLLM's weight-transfer API. The engine is built with
  ``weight_transfer_config=WeightTransferConfig(backend=...)``; the caller is the trainer side
  (``WeightTransferTrainerFactory.trainer_init``, once) and each update is one ``send_weights()``, which drives
  ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` on the engine. ``ipc`` shares CUDA
  tensors with workers on the caller's GPU; ``nccl`` broadcasts to workers on other GPUs.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "search_rl.rollout.engines.vllm_sync.WorkerExtension"
"""``vllm.LLM(worker_extension_cls=...)``: the qualified name vLLM's workers import."""
SHM = Path("/dev/shm")


def resolve_weight_sync(choice: str, tensor_parallel_size: int) -> str:
    """``disk``, ``ipc`` or ``nccl`` for a ``rollout.vllm.weight_sync`` value on this machine.

    Raises:
        ValueError: ``ipc``/``nccl`` without CUDA.
    """
    cuda = torch.cuda.is_available()
    if choice == "auto":
        return "disk" if not cuda else ("ipc" if tensor_parallel_size == 1 else "nccl")
    if choice in ("ipc", "nccl") and not cuda:
        raise ValueError(f"rollout.vllm.weight_sync={choice} needs CUDA; use disk (or auto) on CPU")
    return choice


def scratch_dir(nbytes: int) -> Path:
    """/dev/shm when it has room for ``nbytes`` (and a margin), else the temporary directory."""
    try:
        if shutil.disk_usage(SHM).free > nbytes * 1.2:
            return SHM
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def reload_from_disk(llm: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``tensors`` as safetensors under /dev/shm and have every worker reload them in place; the folder is
    removed afterwards (the workers have read it)."""
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    nbytes = sum(t.numel() * t.element_size() for t in cpu.values())
    folder = tempfile.mkdtemp(prefix="search-rl-weights-", dir=scratch_dir(nbytes))
    try:
        save_file(cpu, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        del cpu
        llm.collective_rpc("search_rl_reload_weights", args=(folder,))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class WorkerExtension:
    """Methods added to every vLLM worker (the class is mixed into vLLM's worker class by name)."""

    def search_rl_reload_weights(self, folder: str) -> int:
        """Reload the model's weights in place from the safetensors in ``folder``; returns how many tied layers were
        re-processed (see the module docstring)."""
        self.reload_weights(weights_path=folder)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        owners = {id(p): name for name, p in model.named_parameters()}
        redone = 0
        for name, module in model.named_modules():
            weight, method = getattr(module, "weight", None), getattr(module, "quant_method", None)
            if method is None or not isinstance(weight, torch.nn.Parameter):
                continue
            owner = owners.get(id(weight))
            if owner is not None and owner != f"{name}.weight":  # tied: the tensor is registered elsewhere first
                method.process_weights_after_loading(module)
                redone += 1
        return redone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TransferSender:
    """The trainer side of vLLM's weight-transfer API for one engine (GPU; ``ipc`` or ``nccl``).

    Args:
        llm: the ``vllm.LLM``, built with ``weight_transfer_config`` of the same backend; ``OfflineClient`` makes it
            the control-plane client (``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
            ``finish_weight_update``).
        backend: ``ipc`` or ``nccl``.
        n_workers: the engine's workers (``tensor_parallel_size``), the NCCL group's other members.
    """

    def __init__(self, llm: Any, backend: str, n_workers: int) -> None:
        self.llm, self.backend, self.n_workers = llm, backend, n_workers
        self._source: Any = None
        self._engine: Any = None

    def send(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """One full update round with ``tensors`` (moved to the current CUDA device)."""
        device = torch.device("cuda", torch.cuda.current_device())
        named = {k: v.detach().to(device) for k, v in tensors.items()}
        if self._engine is None:
            self._start(named)
        self._source.tensors = named
        self._engine.send_weights()
        self._source.tensors = {}

    def _start(self, named: Mapping[str, torch.Tensor]) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self._source = _state_source(named)
        info: Any
        if self.backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0)
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            port = _free_port()
            info = NCCLTrainerInitInfo("127.0.0.1", port, 1 + self.n_workers, rank=0)
        client = OfflineClient(self.llm)
        self._engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=self._source)


class OfflineClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``vllm.LLM``: the trainer engines pass the bare
    init/update payloads, while ``LLM`` takes them wrapped as ``{"init_info": ...}`` / ``{"update_info": ...}``."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def _state_source(first: Mapping[str, torch.Tensor]) -> Any:
    """A ``vllm`` ``WeightSource`` over a replaceable dict of full tensors (names, dtypes and shapes fixed by the
    first update, as the transfer plans require)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateSource(WeightSource):  # type: ignore[misc]
        def __init__(self) -> None:
            self.meta = [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in first.items()]
            self.tensors: Mapping[str, torch.Tensor] = {}

        def metadata(self) -> list[Any]:
            return self.meta

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for m in self.meta:
                yield m.name, self.tensors[m.name]

    return StateSource()
