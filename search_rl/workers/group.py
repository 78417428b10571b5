"""Worker groups: ``n`` data-parallel workers of one class, driven by two typed helpers.

- ``broadcast(Worker.method, *args)``: every worker runs ``method(*args)``; returns their results in rank order.
- ``map_shards(Worker.method, batch, *args)``: the batch is split into near-equal shards, worker ``i`` runs
  ``method(shard_i, *args)``; returns the results in rank order.

The trainer passes the worker's method itself (``actor.broadcast(ActorRolloutRefWorker.save_checkpoint, path)``),
never its name: the type checker checks the arguments and the result type, a renamed method is a type error, and a
reader can jump from the call to the worker's code. The group calls the method of that name on its workers.

``WorkerGroup`` runs the workers as Ray actors and calls ``ray.get`` with the group's timeout, so a stuck collective
fails the run instead of hanging it. This is verl's single controller (the driver owns the loop, workers own the
weights) without its dispatch magic. ``LocalWorkerGroup`` runs one worker in the driver's process with the same
interface (``trainer.use_ray=false``, tests, benchmarks). ``Workers`` is what the trainer needs from either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from search_rl.batches import BatchOps
from search_rl.workers.distributed import WorkerSpec

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
B = TypeVar("B", bound=BatchOps)
W_co = TypeVar("W_co", covariant=True)


class DistributedWorker(Protocol):
    """What a group needs from its worker class to join the workers in one process group."""

    def master_address(self) -> tuple[str, int]: ...

    def init_distributed(self, host: str, port: int) -> None: ...


W = TypeVar("W", bound=DistributedWorker)


class Workers(Protocol[W_co]):
    """A group of ``W_co`` workers (``WorkerGroup`` or ``LocalWorkerGroup``): what the trainer calls."""

    def broadcast(self, method: Callable[Concatenate[W_co, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run ``method(*args, **kwargs)`` on every worker; results in rank order."""
        ...

    def map_shards(
        self, method: Callable[Concatenate[W_co, B, P], R], batch: B, *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        """Split ``batch`` over the workers and run ``method(shard, *args, **kwargs)`` on each; results in order."""
        ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def __len__(self) -> int: ...


def method_name(worker_cls: type, method: Callable[..., Any]) -> str:
    """The name of ``method`` if ``worker_cls`` has a method of that name.

    Raises:
        TypeError: ``method`` is a string or not a method of ``worker_cls``.
    """
    name = getattr(method, "__name__", None)
    if isinstance(method, str) or not isinstance(name, str) or not callable(getattr(worker_cls, name, None)):
        raise TypeError(
            f"{worker_cls.__name__} has no method {method!r}: pass one of its methods itself, such as "
            f"{worker_cls.__name__}.{'save_checkpoint' if name is None else name}, not a name or another function"
        )
    return name


class WorkerGroup(Generic[W]):
    """``n`` Ray actors of ``worker_cls``, ranks 0..n-1, joined in one process group.

    Args:
        worker_cls: a plain class whose ``__init__`` takes ``spec: WorkerSpec`` first, with ``master_address()`` and
            ``init_distributed(host, port)`` methods.
        specs: one ``WorkerSpec`` per rank.
        name: for logs and Ray actor names.
        num_cpus: CPUs Ray reserves per worker (fractions are fine).
        num_gpus: GPUs per worker (0 on CPU).
        timeout_s: longest wait for one call.
        **init_kwargs: the remaining constructor arguments (configs), the same for every rank.
    """

    def __init__(
        self,
        worker_cls: type[W],
        specs: list[WorkerSpec],
        *,
        name: str,
        num_cpus: float,
        num_gpus: float,
        timeout_s: float,
        **init_kwargs: Any,
    ) -> None:
        import ray

        self._ray = ray
        self.worker_cls, self.name, self.timeout_s = worker_cls, name, timeout_s
        remote_cls: Any = ray.remote(worker_cls)
        # Constructors run in the background; ``start`` waits for them, so several groups load their models at once.
        self.workers: list[Any] = [
            remote_cls.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(spec, **init_kwargs) for spec in specs
        ]

    def start(self) -> None:
        """Wait for the workers' constructors, then join them in one process group (rank 0 hosts the rendezvous)."""
        host, port = self._get([self.workers[0].master_address.remote()])[0]
        self.broadcast(DistributedWorker.init_distributed, host, port)
        logger.info("%s: %d workers ready (rendezvous %s:%d)", self.name, len(self.workers), host, port)

    def __len__(self) -> int:
        return len(self.workers)

    def _get(self, refs: list[Any]) -> list[Any]:
        return list(self._ray.get(refs, timeout=self.timeout_s))

    def broadcast(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run ``method(*args, **kwargs)`` on every worker; results in rank order."""
        name = method_name(self.worker_cls, method)
        return self._get([getattr(w, name).remote(*args, **kwargs) for w in self.workers])

    def map_shards(
        self, method: Callable[Concatenate[W, B, P], R], batch: B, *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        """Split ``batch`` over the workers and run ``method(shard, *args, **kwargs)`` on each; results in order.

        A batch smaller than the group uses the first ``len(batch)`` workers only (allowed for methods without
        collectives, such as ``generate``).
        """
        name = method_name(self.worker_cls, method)
        shards = batch.split(len(self.workers))
        refs = [getattr(w, name).remote(s, *args, **kwargs) for w, s in zip(self.workers, shards, strict=False)]
        return self._get(refs)

    def shutdown(self) -> None:
        """Stop the workers (their processes exit; the process group goes with them)."""
        for w in self.workers:
            self._ray.kill(w)
        self.workers = []


class LocalWorkerGroup(Generic[W]):
    """One worker in this process, with ``WorkerGroup``'s interface (no Ray; world size 1)."""

    def __init__(self, worker_cls: type[W], spec: WorkerSpec, **init_kwargs: Any) -> None:
        if spec.world_size != 1:
            raise ValueError("LocalWorkerGroup runs exactly one worker (world_size=1); use WorkerGroup for more")
        self.worker_cls = worker_cls
        self.worker: W | None = worker_cls(spec, **init_kwargs)  # type: ignore[call-arg]

    def _live(self) -> W:
        if self.worker is None:
            raise RuntimeError(f"the local {self.worker_cls.__name__} was shut down")
        return self.worker

    def start(self) -> None:
        worker = self._live()
        worker.init_distributed(*worker.master_address())

    def __len__(self) -> int:
        return 1

    def broadcast(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        bound: Callable[P, R] = getattr(self._live(), method_name(self.worker_cls, method))
        return [bound(*args, **kwargs)]

    def map_shards(
        self, method: Callable[Concatenate[W, B, P], R], batch: B, *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        bound: Callable[Concatenate[B, P], R] = getattr(self._live(), method_name(self.worker_cls, method))
        return [bound(batch, *args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None
