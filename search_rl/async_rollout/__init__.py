"""Asynchronous training (``trainer.mode`` ``one_step_off`` / ``async``): generator actors, the trainer's bounded
queue of whole groups, versioned weights (``docs/training.md#training-modes``).

- ``queue.py``: ``GroupQueue``, bounded (back-pressure) with staleness dropping.
- ``groups.py``: ``Group``, the queue's item (whole GRPO groups), cutting units and assembling steps.
- ``weights.py``: ``WeightStore``, where published weights wait for the generators to pull them.
- ``coordinator.py``: ``AsyncRolloutSource``, the thread that feeds generators and the queue; the trainer's source of
  rollouts in the asynchronous modes.

The generator actor itself is ``search_rl.async_rollout.generator.GeneratorWorker``.
"""

from search_rl.async_rollout.coordinator import AsyncRolloutSource, GeneratorFailure, SourceSettings
from search_rl.async_rollout.groups import Group
from search_rl.async_rollout.queue import GroupQueue, Taken
from search_rl.async_rollout.weights import WeightStore

__all__ = [
    "AsyncRolloutSource",
    "GeneratorFailure",
    "Group",
    "GroupQueue",
    "SourceSettings",
    "Taken",
    "WeightStore",
]
