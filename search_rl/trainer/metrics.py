"""Step metrics the trainers share: the workers' metrics merged into one dict, and the step's throughput."""

from __future__ import annotations

from search_rl.batches import TrainBatch


def mean_worker_metrics(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Mean over workers of each metric; ``perf/*`` token counts are summed.

    >>> mean_worker_metrics([{"actor/loss": 1.0, "perf/tokens": 3.0}, {"actor/loss": 3.0, "perf/tokens": 4.0}])
    {'actor/loss': 2.0, 'perf/tokens': 7.0}
    """
    keys = sorted({k for d in dicts for k in d})
    out = {}
    for k in keys:
        values = [d[k] for d in dicts if k in d]
        out[k] = sum(values) if k.startswith("perf/") else sum(values) / len(values)
    return out


def throughput_metrics(m: dict[str, float], batch: TrainBatch) -> None:
    """Tokens per second of the step and of the actor update, added to ``m``."""
    tokens = float(batch.attention_mask.sum())
    m["perf/total_tokens"] = tokens
    m["perf/tokens_per_s"] = tokens / max(m["timing/step_s"], 1e-9)
    if "perf/actor_update_tokens" in m:
        m["perf/actor_update_tokens_per_s"] = m["perf/actor_update_tokens"] / max(m["timing/update_actor_s"], 1e-9)
