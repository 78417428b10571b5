"""``WorkerGroup``: ``n`` data-parallel Ray actors of one worker class, driven by two visible helpers.

- ``broadcast(method, *args)``: every worker runs ``method(*args)``; returns their results in rank order.
- ``map_shards(method, batch, *args)``: the batch is split into near-equal shards, worker ``i`` runs
  ``method(shard_i, *args)``; returns the results in rank order.

Both call ``ray.get`` with the group's timeout, so a stuck collective fails the run instead of hanging it. This is
verl's single controller (the driver owns the loop, workers own the weights) without its dispatch magic: methods
are named strings resolved on the worker class, and ``WorkerGroup`` checks that the class has them.
``LocalWorkerGroup`` runs one worker in the driver's process with the same interface (tests, benchmarks).
"""

from __future__ import annotations

import logging
from typing import Any

from search_rl.batches import BatchOps
from search_rl.workers.distributed import WorkerSpec

logger = logging.getLogger(__name__)


def _check_method(worker_cls: type, method: str) -> None:
    if not callable(getattr(worker_cls, method, None)):
        raise AttributeError(f"{worker_cls.__name__} has no method {method!r}")


class WorkerGroup:
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
        worker_cls: type,
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
        self.broadcast("init_distributed", host, port)
        logger.info("%s: %d workers ready (rendezvous %s:%d)", self.name, len(self.workers), host, port)

    def __len__(self) -> int:
        return len(self.workers)

    def _get(self, refs: list[Any]) -> list[Any]:
        return list(self._ray.get(refs, timeout=self.timeout_s))

    def broadcast(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method(*args, **kwargs)`` on every worker; results in rank order."""
        _check_method(self.worker_cls, method)
        return self._get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def map_shards(self, method: str, batch: BatchOps, *args: Any, **kwargs: Any) -> list[Any]:
        """Split ``batch`` over the workers and run ``method(shard, *args, **kwargs)`` on each; results in order.

        A batch smaller than the group uses the first ``len(batch)`` workers only (allowed for methods without
        collectives, such as ``generate``).
        """
        _check_method(self.worker_cls, method)
        shards = batch.split(len(self.workers))
        refs = [getattr(w, method).remote(s, *args, **kwargs) for w, s in zip(self.workers, shards, strict=False)]
        return self._get(refs)

    def shutdown(self) -> None:
        """Stop the workers (their processes exit; the process group goes with them)."""
        for w in self.workers:
            self._ray.kill(w)
        self.workers = []


class LocalWorkerGroup:
    """One worker in this process, with ``WorkerGroup``'s interface (no Ray; world size 1)."""

    def __init__(self, worker_cls: type, spec: WorkerSpec, **init_kwargs: Any) -> None:
        if spec.world_size != 1:
            raise ValueError("LocalWorkerGroup runs exactly one worker (world_size=1); use WorkerGroup for more")
        self.worker_cls = worker_cls
        self.worker = worker_cls(spec, **init_kwargs)

    def start(self) -> None:
        self.worker.init_distributed(*self.worker.master_address())

    def __len__(self) -> int:
        return 1

    def broadcast(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        _check_method(self.worker_cls, method)
        return [getattr(self.worker, method)(*args, **kwargs)]

    def map_shards(self, method: str, batch: BatchOps, *args: Any, **kwargs: Any) -> list[Any]:
        _check_method(self.worker_cls, method)
        return [getattr(self.worker, method)(batch, *args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None
