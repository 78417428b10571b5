"""Weight updates into a running ``vllm.LLM``, without pickled closures (vLLM ``SUPPORTED_VLLM``: 0.32 and 0.33).

Two ways, chosen by ``rollout.vllm.weight_sync`` (``resolve_weight_sync``; ``auto`` is ``disk`` everywhere):

- ``disk`` (any device; tested on CPU): the tensors are written as one safetensors file into a fresh folder under
  /dev/shm (memory, not disk), and every vLLM worker reloads it in place with ``reload_weights(weights_path=...)``
  through ``WorkerExtension.search_rl_reload_weights`` (an RPC by method name; ``vllm.LLM(worker_extension_cls=...)``).
  The CPU backend repacks each linear layer's weight for its GEMM kernel after loading; a tied ``lm_head`` shares
  the embedding's tensor but keeps its own packed copy, which vLLM's layer-wise reload does not redo, so the
  extension re-runs the processing of every layer whose weight belongs to another module.
- ``ipc`` (GPU, only when named; it has never run on a GPU in this project): vLLM's weight-transfer API with CUDA IPC
  handles. The engine is built with ``weight_transfer_config=WeightTransferConfig(backend="ipc")``; the process that
  holds the ``vllm.LLM`` is the trainer side (``WeightTransferTrainerFactory.trainer_init``, once), on the engine's
  own GPU, and each update is one ``send_weights()``, which drives ``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update``. The handles travel to the engine core as pickles, which vLLM's message encoder refuses
  unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (``allow_pickled_messages``).

``nccl`` has no layout here (the sender would share the engine's GPU) and is refused by the config.
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ">=0.32,<0.34"
"""The vLLM releases this module is written and tested against (pyproject.toml's ``vllm`` extra says the same)."""
WORKER_EXTENSION = "search_rl.rollout.engines.vllm.weight_sync.WorkerExtension"
"""``vllm.LLM(worker_extension_cls=...)``: the qualified name vLLM's workers import."""
INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"
"""vLLM's switch that lets its inter-process messages carry pickles (needed by ``ipc``)."""
SHM = Path("/dev/shm")


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside ``SUPPORTED_VLLM``: its weight-transfer classes change between releases. Only the
    release numbers count (``0.32.0+cpu`` is 0.32.0).

    Raises:
        ImportError: naming the installed and the supported versions.
    """
    release = ".".join(str(n) for n in Version(version).release)
    if release not in SpecifierSet(SUPPORTED_VLLM):
        raise ImportError(
            f"search-rl's vLLM backend supports vllm{SUPPORTED_VLLM}; this environment has vllm {version}. "
            "Install a supported one: pip install 'search-rl[vllm]' (GPU) or make install-vllm (CPU)"
        )


def resolve_weight_sync(choice: str) -> str:
    """``disk`` or ``ipc`` for a ``rollout.vllm.weight_sync`` value on this machine. ``auto`` is ``disk`` on every
    device: ``ipc`` has never run on a GPU here and makes vLLM's engine core accept pickled messages
    (``allow_pickled_messages``), so it runs only when named.

    Raises:
        ValueError: ``ipc`` without CUDA, or a value the config does not accept.
    """
    if choice == "auto":
        return "disk"
    if choice == "ipc" and not torch.cuda.is_available():
        raise ValueError("rollout.vllm.weight_sync=ipc needs CUDA; use disk (or auto) on CPU")
    if choice not in ("disk", "ipc"):
        raise ValueError(f"rollout.vllm.weight_sync must be auto, disk or ipc, got {choice!r}")
    return choice


def allow_pickled_messages() -> None:
    """Set ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in this process before its ``vllm.LLM`` starts (the engine core
    process inherits it): ``ipc`` sends ``torch.multiprocessing`` reduce arguments (tensor and storage classes, a
    dtype), which vLLM's msgpack encoder and decoder only pass as pickles.

    The trade-off: the engine core then unpickles what arrives on its local ZMQ sockets, so any process that can
    write to them can run code in it. ``disk`` needs no pickling.

    Raises:
        ValueError: the variable is set to something else (the user turned it off).
        RuntimeError: vLLM in this process already froze its environment with the variable off (an engine core
            that ran in this process before).
    """
    value = os.environ.get(INSECURE_SERIALIZATION)
    if value not in (None, "1"):
        raise ValueError(
            f"rollout.vllm.weight_sync=ipc needs {INSECURE_SERIALIZATION}=1 (CUDA IPC handles travel as pickles), "
            f"but this process has {INSECURE_SERIALIZATION}={value!r}; unset it, or use rollout.vllm.weight_sync=disk"
        )
    os.environ[INSECURE_SERIALIZATION] = "1"
    import vllm.envs

    if not vllm.envs.VLLM_ALLOW_INSECURE_SERIALIZATION:
        raise RuntimeError(
            f"vLLM cached its environment before {INSECURE_SERIALIZATION}=1 was set in this process; set it before "
            "the process starts, or use rollout.vllm.weight_sync=disk"
        )
    logger.warning(
        "rollout.vllm.weight_sync=ipc: %s=1 in this process and its vLLM engine core, so CUDA IPC handles can travel "
        "as pickles; the engine then unpickles what arrives on its local sockets (anyone who can write to them can "
        "run code in it). rollout.vllm.weight_sync=disk needs no pickling",
        INSECURE_SERIALIZATION,
    )


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


class TransferSender:
    """The trainer side of vLLM's ``ipc`` weight transfer for one engine on this process's GPU.

    Args:
        llm: the ``vllm.LLM``, built with ``weight_transfer_config=WeightTransferConfig(backend="ipc")`` after
            ``allow_pickled_messages``; ``OfflineClient`` makes it the control-plane client.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm
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
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        self._source = state_source(named)
        client = OfflineClient(self.llm)
        self._engine = WeightTransferTrainerFactory.trainer_init(
            IPCTrainerInitInfo(rank=0), client=client, source=self._source
        )


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


def state_source(first: Mapping[str, torch.Tensor]) -> Any:
    """The installed vLLM's ``WeightSource`` over a replaceable dict of full tensors (see ``source_class``)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    return source_class(WeightSource, ParamMeta)(first)


def source_class(weight_source: type, param_meta: type) -> type:
    """A ``WeightSource`` subclass over a replaceable dict ``tensors`` of full tensors, for either contract of vLLM's
    base class; names, dtypes and shapes are fixed by the first update (``__init__(first)``), as the transfer plans
    require.

    - 0.32: ``metadata()`` is a method, and the engines iterate the source itself (``__iter__``).
    - 0.33: ``metadata`` must be a ``functools.cached_property`` (checked when the subclass is defined), and IPC
      reads ``iter_full()``.

    Args:
        weight_source: vLLM's ``WeightSource`` (``vllm.distributed.weight_transfer.base``).
        param_meta: vLLM's ``ParamMeta`` of the same module.
    """

    class Common(weight_source):  # type: ignore[misc,valid-type]
        def __init__(self, first: Mapping[str, torch.Tensor]) -> None:
            self.meta = [param_meta(k, v.dtype, tuple(v.shape)) for k, v in first.items()]
            self.tensors: Mapping[str, torch.Tensor] = {}

        def pairs(self) -> Iterator[tuple[str, torch.Tensor]]:
            for m in self.meta:
                yield m.name, self.tensors[m.name]

    if isinstance(inspect.getattr_static(weight_source, "metadata"), property):  # 0.33

        class StateSource(Common):
            @cached_property
            def metadata(self) -> list[Any]:
                return list(self.meta)

            def iter_full(self) -> Iterator[tuple[str, torch.Tensor]]:
                return self.pairs()

        return StateSource

    class StateSource032(Common):  # 0.32
        def metadata(self) -> list[Any]:
            return list(self.meta)

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return self.pairs()

    return StateSource032
