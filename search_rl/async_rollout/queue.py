"""``GroupQueue``: the trainer's bounded queue of finished GRPO groups, with back-pressure and bounded staleness.

The unit of the queue is a whole group (the ``rollout.n`` samples of one prompt), so the trainer can only take, and
only drop, whole groups: a group is never split across steps, and a group baseline never mixes weight versions.

Capacity counts what is *ready* plus what is *reserved*: a producer reserves room for a unit of work before it
starts generating (``reserve``), and converts the reservation into ready groups when the unit is done (``put``) or
gives it back when the unit is lost (``release``). So the queue never holds more than ``capacity`` groups, and a
producer that cannot reserve does not start: that is the back-pressure, and memory stays bounded whatever the speed
of the consumer.

Staleness is measured when the trainer takes a batch: ``current_version - item.weight_version``. Older groups than
``max_staleness`` are dropped (counted, returned to the caller for metrics), never trained on. The queue hands out
the oldest acceptable groups first (by weight version, then arrival), which keeps the arrival order of one producer
and drops as little as possible when several producers finish out of order.

Pure Python and thread-safe (one ``threading.Condition``): the coordinator's thread produces, the trainer consumes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Versioned(Protocol):
    """What the queue needs from an item: the weight version that produced it."""

    @property
    def weight_version(self) -> int: ...


T = TypeVar("T", bound=Versioned)


@dataclass(frozen=True)
class Taken(Generic[T]):
    """The result of ``GroupQueue.take``: the groups to train on, and the stale ones dropped on the way."""

    groups: list[T]
    """Exactly ``n`` groups, oldest first (empty when the wait timed out)."""
    dropped: list[T]
    """Groups dropped because they were more than ``max_staleness`` versions old."""
    depth: int
    """Ready groups in the queue when the take began (before dropping)."""


class GroupQueue(Generic[T]):
    """Bounded, thread-safe queue of groups.

    Args:
        capacity: most groups ready + reserved at any time (>= the groups of one training batch).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"GroupQueue: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ready: list[tuple[int, int, T]] = []  # (weight_version, arrival, group)
        self._reserved = 0
        self._arrivals = 0
        self._taken = 0
        self._cond = threading.Condition()
        self.max_depth = 0
        """Most groups ever held (ready + reserved): never above ``capacity``."""

    # --- producer side -----------------------------------------------------------------------------------------

    def free(self) -> int:
        """Room left for new reservations, in groups."""
        with self._cond:
            return self.capacity - len(self._ready) - self._reserved

    def reserve(self, n: int) -> bool:
        """Reserve room for ``n`` groups; False (nothing reserved) when it does not fit."""
        with self._cond:
            if len(self._ready) + self._reserved + n > self.capacity:
                return False
            self._reserved += n
            self.max_depth = max(self.max_depth, len(self._ready) + self._reserved)
            return True

    def put(self, groups: Sequence[T], reserved: int) -> None:
        """Add finished groups, using ``reserved`` groups of reservation (``len(groups) <= reserved``; the rest of the
        reservation is given back)."""
        with self._cond:
            if len(groups) > reserved or reserved > self._reserved:
                raise ValueError(f"GroupQueue.put: {len(groups)} groups for a reservation of {reserved}")
            self._reserved -= reserved
            for g in groups:
                self._ready.append((g.weight_version, self._arrivals, g))
                self._arrivals += 1
            self._ready.sort(key=lambda e: (e[0], e[1]))
            self._cond.notify_all()

    def release(self, reserved: int) -> None:
        """Give back a reservation whose unit was lost."""
        self.put([], reserved)

    # --- consumer side -----------------------------------------------------------------------------------------

    def take(self, n: int, current_version: int, max_staleness: int, timeout_s: float) -> Taken[T]:
        """Wait up to ``timeout_s`` for ``n`` groups at most ``max_staleness`` versions behind ``current_version``;
        drop older ones on the way. Returns ``n`` groups, or none when the wait timed out (the stale ones dropped
        until then are returned either way, and the fresh ones stay queued)."""
        deadline = time.monotonic() + timeout_s
        dropped: list[T] = []
        with self._cond:
            depth = len(self._ready)
            while True:
                keep = [e for e in self._ready if current_version - e[0] <= max_staleness]
                dropped += [e[2] for e in self._ready if current_version - e[0] > max_staleness]
                if len(keep) != len(self._ready):
                    self._ready = keep
                    self._cond.notify_all()  # room freed for producers
                if len(self._ready) >= n:
                    taken, self._ready = self._ready[:n], self._ready[n:]
                    self._taken += n
                    self._cond.notify_all()
                    return Taken([e[2] for e in taken], dropped, depth)
                left = deadline - time.monotonic()
                if left <= 0:
                    return Taken([], dropped, depth)
                self._cond.wait(left)

    def wake(self) -> None:
        """Wake every waiter (after an outside event: new weights, a failure, shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def counts(self) -> tuple[int, int, int]:
        """``(taken so far, ready, reserved)`` in groups, read at one instant (a producer's scheduling decision must
        not see a group gone from the queue but not yet counted as taken)."""
        with self._cond:
            return self._taken, len(self._ready), self._reserved

    def __len__(self) -> int:
        """Ready groups."""
        with self._cond:
            return len(self._ready)

    @property
    def reserved(self) -> int:
        with self._cond:
            return self._reserved

    def clear(self) -> int:
        """Drop every ready group (shutdown); returns how many."""
        with self._cond:
            n, self._ready = len(self._ready), []
            self._cond.notify_all()
            return n
