"""Workers: the Ray actors that own the models (actor + rollout + reference, critic) and their data parallelism."""

from search_rl.workers.distributed import WorkerSpec
from search_rl.workers.group import LocalWorkerGroup, WorkerGroup, Workers

__all__ = ["LocalWorkerGroup", "WorkerGroup", "WorkerSpec", "Workers"]
