"""The search cost meter: live backend calls, their estimated cost, and answers served from a recording.

Every backend has a ``meter``; the agent loop reads its deltas per rollout call into ``rollout/search_calls``,
``rollout/search_cost_usd`` and ``rollout/searches_replayed`` (summed over workers: a step's totals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CostMeter:
    """Running totals of one backend instance (one process)."""

    calls: int = 0
    """Queries answered by the live backend (for ``web``: billed API calls)."""
    cost_usd: float = 0.0
    """Estimated spend of those calls in USD (``web`` only; 0 for local backends)."""
    replayed: int = 0
    """Queries answered from a recording."""

    def totals(self) -> tuple[int, float, int]:
        return self.calls, self.cost_usd, self.replayed


def meter_of(retriever: Any) -> CostMeter | None:
    """The retriever's meter, or None for a retriever without one (a test double)."""
    meter = getattr(retriever, "meter", None)
    return meter if isinstance(meter, CostMeter) else None


def meter_metrics(before: tuple[int, float, int], after: tuple[int, float, int], n_samples: int) -> dict[str, float]:
    """The metrics of one rollout call from the meter's totals before and after it.

    >>> meter_metrics((1, 0.5, 0), (4, 2.0, 2), 3)["rollout/search_cost_usd_per_sample"]
    0.5
    """
    calls, cost, replayed = (b - a for a, b in zip(before, after, strict=True))
    return {
        "rollout/search_calls": float(calls),
        "rollout/search_cost_usd": float(cost),
        "rollout/searches_replayed": float(replayed),
        "rollout/search_cost_usd_per_sample": float(cost) / max(n_samples, 1),
    }
