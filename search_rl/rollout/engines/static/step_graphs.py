"""Captured decode steps, each checked against the eager step it replaces before it is trusted.

A CUDA graph replays the kernels it recorded on the tensors it recorded; anything the step took from Python at
capture time (a shape, an index, a scalar) is frozen into it. A mistake there, or in the allocator's pool, gives
wrong tokens silently on whatever GPU first hits it. So every captured step is replayed against an eager run of the
same step on the same inputs, twice: at capture, and at its next use (where the inputs differ from the ones the
capture saw, which exposes a value frozen at capture). A step that differs raises ``GraphMismatch``; an exception
while capturing or replaying raises ``GraphError``. The engine then drops its graphs, logs one warning naming the
stage, the shape and the difference or the error, counts it, and decodes eagerly.

The comparison (``replay_differs``), row by row: each live row's relative L2 difference of the logits, the largest
of them against ``replay_bound``, and the sampled tokens of every row, exactly, on every checked replay. Rows that
are idle or finished compute garbage nobody reads, so they are left out; a norm over the whole batch would dilute
one stale row among 64 to an eighth of its own difference.

The bound (``replay_bound``): a replay runs the same kernels, with the same launch shapes, on the same inputs as the
eager step, so a correct replay is bitwise equal to it and the difference is exactly 0 (the CPU stand-in shows 0).
The one admitted source of a difference is a reduction whose order depends on scheduling (atomics in a split-K
matmul): it rounds its outputs differently by at most one unit in the last place, ``2u`` relative (``u`` = unit
roundoff of the model's dtype: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32), and the layers after it carry that on (each
RMSNorm rescales the residual stream, so a relative difference is not amplified much). ``REPLAY_ROUNDOFFS = 4``
units admit one such reduction moving every element of an activation by one ulp with a gain of 2 on its way to the
logits: 0.016 in bf16, 2.4e-7 in fp32, whatever the depth. This is not the bound for two different computations
(the engine against the trainer: ``mismatch_bound``, ``2 * u * sqrt(layers)``, where every layer rounds in other
places and the roundings add like a random walk). A replay that reads a stale position, token or cache row differs
by O(1) in that row. A token that differs while the logits are within the bound (a near tie meeting a reordered
reduction) also fails the check: a false alarm costs the graphs' speed, a wrong token passed on would be trained on.

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

REPLAY_ROUNDOFFS = 4
"""A checked replay's largest per-row relative L2 difference, in units of roundoff of the model's dtype (module
docstring)."""


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


class GraphFallback(RuntimeError):
    """A captured step cannot be trusted; ``stage`` says where that showed (``capture``, ``replay``, ``mismatch``)."""

    stage = ""


class GraphError(GraphFallback):
    """Capturing or replaying a step raised (``stage``: ``capture`` or ``replay``); the error is the cause."""

    def __init__(self, stage: str, key: Hashable, error: BaseException) -> None:
        super().__init__(f"{stage} of the decode step {key} raised {type(error).__name__}: {error}")
        self.stage, self.key = stage, key


class GraphMismatch(GraphFallback):
    """A captured step gave other results than the eager step on the same inputs."""

    stage = "mismatch"

    def __init__(self, key: Hashable, difference: float, bound: float, row: int, tokens_equal: bool) -> None:
        tokens = "" if tokens_equal else "; its sampled tokens differ"
        super().__init__(
            f"captured decode step {key} differs from the eager step: row {row} by {difference:.3g} "
            f"(bound {bound:.3g}){tokens}"
        )
        self.key, self.difference, self.bound, self.row = key, difference, bound, row


def mismatch_bound(dtype: torch.dtype, layers: int) -> float:
    """The largest relative L2 difference of two different computations of the same logits (the engine's and the
    trainer's forward): ``2 * u * sqrt(layers)``, each layer rounding in other places (module docstring). A replay
    and its eager step are held to ``replay_bound``."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return 2 * unit_roundoff * math.sqrt(max(layers, 1))


def replay_bound(dtype: torch.dtype) -> float:
    """The largest per-row relative L2 difference a correct replay may show against its eager step: a few units of
    roundoff of ``dtype`` (``REPLAY_ROUNDOFFS``; module docstring).

    >>> replay_bound(torch.bfloat16), replay_bound(torch.float32)
    (0.015625, 2.384185791015625e-07)
    """
    return REPLAY_ROUNDOFFS * torch.finfo(dtype).eps / 2


def replay_differs(replayed: torch.Tensor, eager: torch.Tensor, live: torch.Tensor) -> tuple[float, int]:
    """The largest relative L2 difference of one live row's logits, and that row (inf where a live replayed row is
    not finite; 0 and row -1 when no row is live).

    Args:
        replayed: (R, V) the replay's logits.
        eager: (R, V) the eager step's logits.
        live: (R,) bool, the rows whose logits are used (idle and finished rows are not).

    >>> eager = torch.ones(3, 4)
    >>> replay_differs(eager + torch.tensor([[0.0], [0.5], [9.0]]), eager, torch.tensor([True, True, False]))
    (0.5, 1)
    """
    replayed, eager = replayed.float(), eager.float()
    scale = torch.linalg.vector_norm(eager, dim=-1).clamp(min=1e-30)  # (R,)
    rows = torch.linalg.vector_norm(replayed - eager, dim=-1) / scale  # (R,)
    rows = torch.where(torch.isfinite(replayed).all(dim=-1), rows, math.inf)
    rows = torch.where(live.to(rows.device), rows, -1.0)
    if rows.numel() == 0 or float(rows.max()) < 0:
        return 0.0, -1
    row = int(rows.argmax())
    return float(rows[row]), row


@dataclass
class _Entry:
    graph: StepGraph
    out: torch.Tensor
    checks_left: int = CHECKED_REPLAYS


class StepGraphs:
    """The captured steps of one engine, by key, and the checks that guard them.

    Args:
        factory: makes a ``StepGraph`` (``None``: CUDA graphs on ``device``'s memory pool).
        bound: per-row relative L2 difference a replay may show (``replay_bound``).
        device: where the graphs run (for CUDA graphs).
    """

    def __init__(self, factory: GraphFactory | None, bound: float, device: torch.device) -> None:
        self._factory = factory
        self.bound, self.device = bound, device
        self._entries: dict[Hashable, _Entry] = {}
        self._pool: Any = None
        self.captures = 0
        """Steps captured so far (a counter for tests and logs)."""
        self.checks = 0
        """Replays compared with the eager step so far (a counter for tests and logs)."""
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

    def _capture(
        self, key: Hashable, step: Callable[[], torch.Tensor], snapshot: Callable[[], Callable[[], None]]
    ) -> _Entry:
        restore = snapshot()
        try:
            entry = _Entry(self._make(), torch.empty(0))
            entry.out = entry.graph.capture(step)
        except Exception as e:  # whatever the capture raised: the engine decodes eagerly
            raise GraphError("capture", key, e) from e
        finally:
            restore()  # warm-ups may have run the step: undo what they did
        self._entries[key] = entry
        self.captures += 1
        logger.debug("captured the decode step %s", key)
        return entry

    def _replay(self, key: Hashable, entry: _Entry) -> None:
        try:
            entry.graph.replay()
        except Exception as e:  # whatever the replay raised: the engine decodes eagerly
            raise GraphError("replay", key, e) from e

    def run(
        self,
        key: Hashable,
        step: Callable[[], torch.Tensor],
        snapshot: Callable[[], Callable[[], None]],
        outcome: Callable[[], torch.Tensor],
        live: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """Run ``step`` (its result: the logits) through the graph captured for ``key``, capturing it first.

        Args:
            key: what the graph depends on (batch rows, width, sampling settings).
            step: the eager step; it updates the decode state in place and returns the logits (R, V).
            snapshot: saves the decode state and returns a function that restores it (the step is not idempotent).
            outcome: what the step decided (R,), compared exactly on every checked replay (the sampled tokens).
            live: (R,) bool before the step, the rows whose logits are used (the others are not compared).

        Raises:
            GraphMismatch: a checked replay differs from the eager step.
            GraphError: capturing or replaying raised.
        """
        entry = self._entries.get(key)
        if entry is None:
            entry = self._capture(key, step, snapshot)
        if entry.checks_left == 0:
            self._replay(key, entry)
            return entry.out
        restore = snapshot()
        alive = live().clone()
        eager = step().clone()
        decided = outcome().clone()
        restore()
        self._replay(key, entry)
        difference, row = replay_differs(entry.out, eager, alive)
        self.max_difference = max(self.max_difference, difference)
        tokens_equal = torch.equal(outcome(), decided)
        self.checks += 1
        if difference > self.bound or not tokens_equal:
            raise GraphMismatch(key, difference, self.bound, row, tokens_equal)
        if bool(alive.any()):  # a check that saw no live row proved nothing
            entry.checks_left -= 1
        return entry.out
