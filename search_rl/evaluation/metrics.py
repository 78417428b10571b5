"""Evaluation metrics beyond EM: tokens per question and how often answers are copied from the evidence."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from search_rl.datatypes import Trajectory
from search_rl.reward.health import answer_copied


def answer_evidence_metrics(
    trajectories: Sequence[Trajectory], data_sources: Sequence[str], prefix: str
) -> dict[str, float]:
    """Per data source and over ``all``: ``<prefix>/<source>/response_tokens`` (mean response length, observations
    included), ``model_tokens`` (mean tokens the model wrote) and ``answer_copy_rate`` (share of the trajectories that
    answered after seeing passages whose answer occurs verbatim, as whole normalised words, in one of them; absent
    when none did)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t, source in zip(trajectories, data_sources, strict=True):
        groups[source].append(t)
        groups["all"].append(t)
    metrics: dict[str, float] = {}
    for source, ts in sorted(groups.items()):
        metrics[f"{prefix}/{source}/response_tokens"] = sum(int(t.response_ids.numel()) for t in ts) / len(ts)
        metrics[f"{prefix}/{source}/model_tokens"] = sum(int(t.response_mask.sum()) for t in ts) / len(ts)
        copied = [c for t in ts if (c := answer_copied(t)) is not None]
        if copied:
            metrics[f"{prefix}/{source}/answer_copy_rate"] = sum(copied) / len(copied)
    return metrics
