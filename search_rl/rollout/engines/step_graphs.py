"""Captured decode steps, each checked against the eager step it replaces before it is trusted.

A CUDA graph replays the kernels it recorded on the tensors it recorded; anything the step took from Python at
capture time (a shape, an index, a scalar) is frozen into it. A mistake there, or in the allocator's pool, gives
wrong tokens silently on whatever GPU first hits it. So every captured step is replayed against an eager run of the
same step on the same inputs, twice: at capture, and at its next use (where the inputs differ from the ones the
capture saw, which exposes a value frozen at capture). A step that differs raises ``GraphMismatch``; the engine then
drops its graphs, logs one warning naming the shape and the difference, and decodes eagerly.

The comparison (``replay_differs``): a correct replay runs the same kernels on the same inputs as the eager step, so
it is bitwise equal except where a kernel reduces in a nondeterministic order (split-K matmuls, atomics), which moves
each layer's output by a few units in the last place. We allow a relative L2 difference of ``2 * u * sqrt(layers)``
(``u`` = unit roundoff of the logits' compute dtype: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32; the rounding errors of
successive layers add like a random walk): 0.047 for bf16 at 36 layers, 1.7e-7 at 2 layers in fp32. A replay that
reads a stale position, token or cache row differs by O(1).

``GraphFactory`` makes the graph objects: CUDA graphs on a GPU; tests give a stand-in that records the captured
callable and re-runs it on replay, so capture, replay, the check and the fallback run on CPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)

CHECKED_REPLAYS = 2
"""Replays of each captured step compared with the eager step: at capture and at the next use."""


class StepGraph(Protocol):
    """A captured step: ``capture`` records ``fn`` (it may run it, e.g. to warm up) and returns its output tensor,
    which every ``replay`` overwrites in place."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...


GraphFactory = Callable[[], StepGraph]


class CudaStepGraph:
    """A CUDA graph of one step, sharing one memory pool with the engine's other graphs (``pool``)."""

    def __init__(self, device: torch.device, pool: Any) -> None:
        self.device, self.pool = device, pool
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits and autotuning happen outside the graph
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class GraphMismatch(RuntimeError):
    """A captured step gave other results than the eager step on the same inputs."""

    def __init__(self, key: Hashable, difference: float, bound: float) -> None:
        super().__init__(f"captured decode step {key} differs from the eager step: {difference:.3g} > {bound:.3g}")
        self.key, self.difference, self.bound = key, difference, bound


def mismatch_bound(dtype: torch.dtype, layers: int) -> float:
    """The largest relative L2 difference a correct replay may show (module docstring)."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return 2 * unit_roundoff * math.sqrt(max(layers, 1))


def replay_differs(replayed: torch.Tensor, eager: torch.Tensor) -> float:
    """Relative L2 difference of two logits tensors (inf where the replay is not finite)."""
    if not torch.isfinite(replayed).all():
        return math.inf
    scale = float(torch.linalg.vector_norm(eager.float()))
    return float(torch.linalg.vector_norm(replayed.float() - eager.float())) / max(scale, 1e-30)


@dataclass
class _Entry:
    graph: StepGraph
    out: torch.Tensor
    checks_left: int = CHECKED_REPLAYS


class StepGraphs:
    """The captured steps of one engine, by key, and the checks that guard them.

    Args:
        factory: makes a ``StepGraph`` (``None``: CUDA graphs on ``device``'s memory pool).
        bound: relative L2 difference a replay may show (``mismatch_bound``).
        device: where the graphs run (for CUDA graphs).
    """

    def __init__(self, factory: GraphFactory | None, bound: float, device: torch.device) -> None:
        self._factory = factory
        self.bound, self.device = bound, device
        self._entries: dict[Hashable, _Entry] = {}
        self._pool: Any = None
        self.captures = 0
        """Steps captured so far (a counter for tests and logs)."""
        self.max_difference = 0.0
        """The largest difference a check has seen (gpu_check reports it)."""

    def __len__(self) -> int:
        return len(self._entries)

    def drop(self) -> None:
        """Free every graph and their memory pool (the cache they read is being replaced). A pool whose graphs were
        all freed must not be captured into again (CUDA's caching allocator asserts), so it goes with them."""
        self._entries, self._pool = {}, None

    def _make(self) -> StepGraph:
        if self._factory is not None:
            return self._factory()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return CudaStepGraph(self.device, self._pool)

    def run(
        self,
        key: Hashable,
        step: Callable[[], torch.Tensor],
        snapshot: Callable[[], Callable[[], None]],
        outcome: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """Run ``step`` (its result: the logits) through the graph captured for ``key``, capturing it first.

        Args:
            key: what the graph depends on (batch rows, width, sampling settings).
            step: the eager step; it updates the decode state in place and returns the logits.
            snapshot: saves the decode state and returns a function that restores it (the step is not idempotent).
            outcome: what the step decided, compared exactly when the logits are bitwise equal (the sampled tokens).

        Raises:
            GraphMismatch: a checked replay differs from the eager step.
        """
        entry = self._entries.get(key)
        if entry is None:
            restore = snapshot()
            entry = _Entry(self._make(), torch.empty(0))
            entry.out = entry.graph.capture(step)  # warm-ups may have run the step: undo what they did
            restore()
            self._entries[key] = entry
            self.captures += 1
            logger.debug("captured the decode step %s", key)
        if entry.checks_left == 0:
            entry.graph.replay()
            return entry.out
        restore = snapshot()
        eager = step().clone()
        decided = outcome().clone()
        restore()
        entry.graph.replay()
        difference = replay_differs(entry.out, eager)
        self.max_difference = max(self.max_difference, difference)
        if difference > self.bound or (difference == 0 and not torch.equal(outcome(), decided)):
            raise GraphMismatch(key, difference, self.bound)
        entry.checks_left -= 1
        return entry.out
