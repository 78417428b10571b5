"""Scoring trajectories against gold answers, and the metrics built from the scores (training, validation, eval).

``score_trajectories`` picks each sample's reward function by its ``data_source`` (``reward.by_data_source``, then
the built-in table, then ``reward.default``). ``reward_metrics`` gives the training-step view (means per data
source, the share of GRPO groups whose rewards are all equal: no learning signal). ``answer_metrics`` gives the
evaluation view: EM / sub-EM / F1, answer rate and searches per question, per data source and over all rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from search_rl.datatypes import GroundTruth, RewardResult, Trajectory
from search_rl.protocol import PromptBatch
from search_rl.reward import reward_fn_for
from search_rl.train_config import RewardConfig

ANSWER_KEYS = ("em", "subem", "f1")
"""Answer-quality components every built-in reward reports."""


def score_trajectories(
    trajectories: Sequence[Trajectory], prompts: PromptBatch, cfg: RewardConfig
) -> list[RewardResult]:
    """One ``RewardResult`` per trajectory (same order as ``prompts``)."""
    if len(trajectories) != len(prompts):
        raise ValueError(f"{len(trajectories)} trajectories for {len(prompts)} prompts")
    results = []
    for traj, source, targets in zip(trajectories, prompts.data_sources, prompts.targets, strict=True):
        fn = reward_fn_for(source, cfg.by_data_source, cfg.default)
        results.append(fn(traj, GroundTruth(target=targets, data_source=source)))
    return results


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def reward_metrics(
    results: Sequence[RewardResult], data_sources: Sequence[str], uids: Sequence[str]
) -> dict[str, float]:
    """``reward/score_mean``, ``reward/<component>`` and ``reward/<source>/{score,em}`` means, and
    ``reward/groups_all_equal``: the share of prompts whose samples all got the same reward."""
    metrics: dict[str, float] = {"reward/score_mean": _mean([r.score for r in results])}
    components = sorted({k for r in results for k in r.components})
    for key in components:
        metrics[f"reward/{key}"] = _mean([r.components.get(key, 0.0) for r in results])
    by_source: dict[str, list[RewardResult]] = defaultdict(list)
    for r, source in zip(results, data_sources, strict=True):
        by_source[source].append(r)
    for source, rs in sorted(by_source.items()):
        metrics[f"reward/{source}/score"] = _mean([r.score for r in rs])
        metrics[f"reward/{source}/em"] = _mean([r.components.get("em", 0.0) for r in rs])
    groups: dict[str, set[float]] = defaultdict(set)
    for r, uid in zip(results, uids, strict=True):
        groups[uid].add(r.score)
    metrics["reward/groups_all_equal"] = _mean([float(len(scores) == 1) for scores in groups.values()])
    return metrics


def answer_metrics(
    trajectories: Sequence[Trajectory], results: Sequence[RewardResult], data_sources: Sequence[str], prefix: str
) -> dict[str, float]:
    """Per data source and over ``all`` rows: ``<prefix>/<source>/{em,subem,f1,score,answer_rate,searches,turns,n}``."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, source in enumerate(data_sources):
        groups[source].append(i)
        groups["all"].append(i)
    metrics: dict[str, float] = {}
    for source, idx in sorted(groups.items()):
        rs = [results[i] for i in idx]
        ts = [trajectories[i] for i in idx]
        for key in ANSWER_KEYS:
            metrics[f"{prefix}/{source}/{key}"] = _mean([r.components.get(key, 0.0) for r in rs])
        metrics[f"{prefix}/{source}/score"] = _mean([r.score for r in rs])
        metrics[f"{prefix}/{source}/answer_rate"] = _mean([float(t.final_answer is not None) for t in ts])
        metrics[f"{prefix}/{source}/searches"] = _mean([float(t.num_searches) for t in ts])
        metrics[f"{prefix}/{source}/turns"] = _mean([float(t.stats.turns) for t in ts])
        metrics[f"{prefix}/{source}/n"] = float(len(idx))
    return metrics
