"""Scoring trajectories against gold answers, and the metrics built from the scores (training, validation, eval).

``score_trajectories`` picks each sample's reward function by its ``data_source`` (``reward.by_data_source``, then
the built-in table, then ``reward.default``) and applies the configured shaping (``reward.format_score``,
``reward.partial_credit``, ``reward.overlong_buffer_tokens``, ``reward.search_penalty``;
``search_rl/reward/shaping.py``) to the score, never to the answer components (the overlong and search penalties are
reported as components of their own). Training,
validation and ``main_eval`` all score here, so they see the same rewards. ``reward_metrics`` gives the
training-step view (means per data source, the share of GRPO groups whose rewards are all equal: no learning
signal). ``answer_metrics`` gives the evaluation view: EM / sub-EM / F1, answer rate and searches per question,
per data source and over all rows, plus, given the gold answers, the search diagnostics of
``search_rl.reward.search_stats`` (valid-search and duplicate-query rates, gold retrieved, wrong answers split by
cause, EM by number of searches).
The training step logs the same diagnostics under ``rollout/`` (``search_stats.search_metrics``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from search_rl.batches import PromptBatch
from search_rl.config import RewardConfig
from search_rl.datatypes import GroundTruth, RewardResult, Trajectory
from search_rl.reward import apply_overlong_penalty, apply_search_penalty, reward_fn_for, shape_reward
from search_rl.reward.search_stats import diagnose, summarize

ANSWER_KEYS = ("em", "subem", "f1")
"""Answer-quality components every built-in reward reports."""


def score_trajectories(
    trajectories: Sequence[Trajectory],
    prompts: PromptBatch,
    cfg: RewardConfig,
    max_response_tokens: int | None = None,
) -> list[RewardResult]:
    """One shaped ``RewardResult`` per trajectory (same order as ``prompts``). ``max_response_tokens`` (the rollout's
    budget) is needed when ``reward.overlong_buffer_tokens`` turns the overlong penalty on."""
    if len(trajectories) != len(prompts):
        raise ValueError(f"{len(trajectories)} trajectories for {len(prompts)} prompts")
    if cfg.overlong_buffer_tokens > 0 and max_response_tokens is None:
        raise ValueError(
            "reward.overlong_buffer_tokens > 0 measures responses against the budget; pass max_response_tokens"
        )
    results = []
    for traj, source, targets in zip(trajectories, prompts.data_sources, prompts.targets, strict=True):
        fn = reward_fn_for(source, cfg.by_data_source, cfg.default)
        result = fn(traj, GroundTruth(target=targets, data_source=source))
        result = shape_reward(result, cfg.format_score, cfg.partial_credit, cfg.partial_credit_weight)
        if cfg.overlong_buffer_tokens > 0:
            assert max_response_tokens is not None
            result = apply_overlong_penalty(
                result,
                int(traj.response_ids.shape[0]),
                max_response_tokens,
                cfg.overlong_buffer_tokens,
                cfg.overlong_penalty_factor,
            )
        if cfg.search_penalty > 0:
            result = apply_search_penalty(result, traj.stats.searches, cfg.search_penalty)
        results.append(result)
    return results


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def share_of_flat_groups(values: Sequence[float], uids: Sequence[str]) -> float | None:
    """Share of groups (samples with the same uid) of 2 or more samples whose values are all equal; None if there is
    no such group. A group of one is left out: it has no spread to measure (with ``rollout.n=1`` every group is).

    >>> share_of_flat_groups([1.0, 0.0, 0.0, 0.0, 0.5], ["a", "a", "b", "b", "c"])
    0.5
    """
    groups: dict[str, list[float]] = defaultdict(list)
    for value, uid in zip(values, uids, strict=True):
        groups[uid].append(value)
    flat = [float(len(set(vs)) == 1) for vs in groups.values() if len(vs) >= 2]
    return _mean(flat) if flat else None


def reward_metrics(
    results: Sequence[RewardResult], data_sources: Sequence[str], uids: Sequence[str]
) -> dict[str, float]:
    """``reward/score_mean``, ``reward/<component>`` and ``reward/<source>/{score,em}`` means, and, when the batch has
    groups of 2 or more samples (GRPO, RLOO), ``reward/groups_all_equal``: the share of those groups whose rewards
    are all equal (GRPO gives them no signal), and ``reward/groups_all_equal_em``: the same on EM alone, so the
    gap between the two is the signal the shaping adds."""
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
    flat = share_of_flat_groups([r.score for r in results], uids)
    flat_em = share_of_flat_groups([r.components.get("em", 0.0) for r in results], uids)
    if flat is not None and flat_em is not None:
        metrics["reward/groups_all_equal"] = flat
        metrics["reward/groups_all_equal_em"] = flat_em
    return metrics


def answer_metrics(
    trajectories: Sequence[Trajectory],
    results: Sequence[RewardResult],
    data_sources: Sequence[str],
    prefix: str,
    targets: Sequence[Sequence[str]] | None = None,
) -> dict[str, float]:
    """Per data source and over ``all`` rows: ``<prefix>/<source>/{em,subem,f1,score,answer_rate,searches,turns,n}``,
    and with ``targets`` (the gold answers per row) the search diagnostics ``search_stats.summarize`` names."""
    diagnoses = None
    if targets is not None:
        diagnoses = [diagnose(t, g, r) for t, r, g in zip(trajectories, results, targets, strict=True)]
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
        if diagnoses is not None:
            metrics.update(summarize([diagnoses[i] for i in idx], f"{prefix}/{source}"))
    return metrics


def pass_at_k_metrics(
    uids: Sequence[str], results: Sequence[RewardResult], data_sources: Sequence[str], prefix: str
) -> dict[str, float]:
    """Per data source and over ``all`` questions: ``<prefix>/<source>/pass@<k>``, the share of questions with at
    least one of their ``k`` samples exactly right (EM 1), and ``<prefix>/<source>/questions``.

    Rows with the same uid are one question's samples; every question must have the same number ``k``.

    Raises:
        ValueError: questions with different numbers of samples, or a uid under two data sources.
    """
    ems: dict[str, list[float]] = defaultdict(list)
    source_of: dict[str, str] = {}
    for uid, result, source in zip(uids, results, data_sources, strict=True):
        if source_of.setdefault(uid, source) != source:
            raise ValueError(f"pass@k: question {uid} is under two data sources ({source_of[uid]}, {source})")
        ems[uid].append(result.components.get("em", 0.0))
    counts = {len(v) for v in ems.values()}
    if len(counts) != 1:
        raise ValueError(f"pass@k needs the same number of samples per question, got {sorted(counts)}")
    k = counts.pop()
    groups: dict[str, list[float]] = defaultdict(list)
    for uid, values in ems.items():
        solved = float(max(values) >= 1.0)
        groups[source_of[uid]].append(solved)
        groups["all"].append(solved)
    metrics: dict[str, float] = {}
    for source, flags in sorted(groups.items()):
        metrics[f"{prefix}/{source}/pass@{k}"] = _mean(flags)
        metrics[f"{prefix}/{source}/questions"] = float(len(flags))
    return metrics
