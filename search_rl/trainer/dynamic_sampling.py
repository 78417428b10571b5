"""DAPO's dynamic sampling (Yu et al. 2025, https://arxiv.org/abs/2503.14476): which groups a step trains on.

A group (the ``rollout.n`` samples of one prompt) whose rewards are all equal has zero advantage under the group
estimators: it adds no policy gradient, only dilutes the batch. With ``algorithm.filter_groups.enable`` the trainer
rolls out generation batches of ``data.train_batch_size`` prompts, keeps the groups whose
``algorithm.filter_groups.metric`` differs within the group, and stops as soon as ``train_batch_size`` of them are
kept (the first ones, in generation order; the rest of that batch is unused) or when
``algorithm.filter_groups.max_num_gen_batches`` batches are spent.

When the cap is hit with fewer groups kept, the step trains on those (a warning and ``dynamic_sampling/cap_hit``
say so): it never fails a run over one unlucky step, and never trains on flat groups in their place. Workers must
hold equal shards, so the kept groups are topped up with dropped (flat) groups to the next multiple of
``group_unit`` groups (one unit when none was kept); these padding groups are marked, and the trainer leaves them out
of the loss (``TrainBatch.sample_mask``), so they only make the shapes work.

``GroupFilter`` is pure: it takes each generation batch's scored rollouts and returns the selection.
``sample_filtered`` is the loop around it, with the rollout and scoring passed in as a function (the trainer's
``_collect_filtered`` passes its own and collates the result).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from search_rl.batches import PromptBatch
from search_rl.datatypes import RewardResult, Trajectory
from search_rl.trainer.steps import SUMMED_ROLLOUT_METRICS

logger = logging.getLogger(__name__)

RollOut = Callable[[PromptBatch, dict[str, float], int], tuple[Sequence[Trajectory], Sequence[RewardResult]]]
"""``(prompts, metrics to fill, generation batch index) -> (trajectories, rewards)``: one scored generation batch."""

PREFIX = "dynamic_sampling"
"""Namespace of the metrics of ``GroupFilter.select``."""
SUMMED_OVER_GENERATIONS = SUMMED_ROLLOUT_METRICS - {"rollout/gen_tokens_per_s"}
"""Counts that add up over consecutive generation batches (throughputs and means are averaged instead)."""


@dataclass(frozen=True)
class ScoredRollouts:
    """Samples with their rollouts and rewards, one row per sample (groups adjacent, as ``PromptBatch`` keeps them)."""

    prompts: PromptBatch
    trajectories: tuple[Trajectory, ...]
    results: tuple[RewardResult, ...]

    def __post_init__(self) -> None:
        if not len(self.prompts) == len(self.trajectories) == len(self.results):
            raise ValueError(
                f"{len(self.prompts)} prompts, {len(self.trajectories)} trajectories, {len(self.results)} rewards"
            )

    def select(self, rows: Sequence[int]) -> ScoredRollouts:
        """The given rows, in that order."""
        return ScoredRollouts(
            self.prompts.select(list(rows)),
            tuple(self.trajectories[i] for i in rows),
            tuple(self.results[i] for i in rows),
        )

    @staticmethod
    def concat(parts: Sequence[ScoredRollouts]) -> ScoredRollouts:
        """Rows of every part, in order."""
        return ScoredRollouts(
            PromptBatch.concat([p.prompts for p in parts]),
            tuple(t for p in parts for t in p.trajectories),
            tuple(r for p in parts for r in p.results),
        )


@dataclass(frozen=True)
class Selection:
    """What a step trains on: the rollouts, which rows are padding (left out of the loss), the metrics."""

    rollouts: ScoredRollouts
    padding: tuple[bool, ...]
    """Per row: True for a flat group added only so that the batch splits evenly over the workers."""
    cap_hit: bool
    """The generation batches ran out before ``target_groups`` groups with a spread were kept."""
    metrics: dict[str, float]
    """``dynamic_sampling/*``: ``gen_batches``, ``kept_groups``, ``dropped_groups``, ``trained_groups``,
    ``unused_groups``, ``padding_groups``, ``cap_hit``."""


def metric_values(results: Sequence[RewardResult], metric: str) -> list[float]:
    """Each result's ``score`` (``metric == "score"``) or reward component ``metric``.

    >>> metric_values([RewardResult(0.2, {"em": 0.0}), RewardResult(1.0, {"em": 1.0})], "em")
    [0.0, 1.0]

    Raises:
        ValueError: a result without that component, naming ``algorithm.filter_groups.metric``.
    """
    if metric == "score":
        return [r.score for r in results]
    missing = [r for r in results if metric not in r.components]
    if missing:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a component of the reward (it reports "
            f"{sorted(missing[0].components)}); use score or one of those"
        )
    return [r.components[metric] for r in results]


def group_rows(uids: Sequence[str]) -> dict[str, list[int]]:
    """Rows of each group, groups in order of first appearance.

    >>> group_rows(["a", "a", "b", "b", "a"])
    {'a': [0, 1, 4], 'b': [2, 3]}
    """
    rows: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
        rows.setdefault(uid, []).append(i)
    return rows


def groups_with_spread(values: Sequence[float], uids: Sequence[str]) -> list[bool]:
    """Per group (in order of first appearance): whether its values are not all equal. A group of one sample has no
    spread.

    >>> groups_with_spread([1.0, 0.0, 0.0, 0.0, 0.5], ["a", "a", "b", "b", "c"])
    [True, False, False]
    """
    if len(values) != len(uids):
        raise ValueError(f"{len(values)} values for {len(uids)} samples")
    return [max(values[i] for i in rows) != min(values[i] for i in rows) for rows in group_rows(uids).values()]


class GroupFilter:
    """Collects the groups with a spread over a step's generation batches and selects what the step trains on.

    Args:
        target_groups: groups a full batch holds (``data.train_batch_size``).
        max_gen_batches: the cap (``algorithm.filter_groups.max_num_gen_batches``).
        metric: ``score`` or a reward component (``algorithm.filter_groups.metric``).
        group_unit: the trained groups (padding included) are a multiple of this, so that the batch splits evenly
            over the workers (``n_workers / gcd(rollout.n, n_workers)``).
    """

    def __init__(self, target_groups: int, max_gen_batches: int, metric: str, group_unit: int = 1) -> None:
        if target_groups < 1 or max_gen_batches < 1 or group_unit < 1:
            raise ValueError(f"GroupFilter needs positive sizes, got {target_groups}, {max_gen_batches}, {group_unit}")
        if target_groups % group_unit:
            raise ValueError(f"{target_groups} groups per batch do not split into units of {group_unit}")
        self.target_groups, self.max_gen_batches = target_groups, max_gen_batches
        self.metric, self.group_unit = metric, group_unit
        self.gen_batches = 0
        self._kept: list[ScoredRollouts] = []
        self._dropped: list[ScoredRollouts] = []
        self._seen: set[str] = set()

    @property
    def done(self) -> bool:
        """Enough groups are kept, or the cap is reached: roll out no further batch."""
        return len(self._kept) >= self.target_groups or self.gen_batches >= self.max_gen_batches

    def add(self, rollouts: ScoredRollouts) -> None:
        """Sort one generation batch's groups into kept and dropped.

        A uid already seen in an earlier batch of the step (the loader wrapped into a new epoch) gets a ``#gen<k>``
        suffix, so that two rollouts of one prompt never merge into one group.
        """
        if self.done:
            raise RuntimeError("GroupFilter.add after the filter is done")
        k = self.gen_batches
        uids = tuple(u if u not in self._seen else f"{u}#gen{k}" for u in rollouts.prompts.uids)
        rollouts = ScoredRollouts(rollouts.prompts.replace(uids=uids), rollouts.trajectories, rollouts.results)
        values = metric_values(rollouts.results, self.metric)
        groups = group_rows(uids)
        for rows, spread in zip(groups.values(), groups_with_spread(values, uids), strict=True):
            (self._kept if spread else self._dropped).append(rollouts.select(rows))
        self._seen.update(uids)
        self.gen_batches += 1

    def select(self) -> Selection:
        """The step's groups: the first ``target_groups`` kept ones; if the cap was hit before that, every kept one
        topped up with dropped ones (marked as padding) to a multiple of ``group_unit``.

        Raises:
            RuntimeError: called before any generation batch was added.
        """
        if not self.gen_batches:
            raise RuntimeError("GroupFilter.select before any generation batch")
        kept = len(self._kept)
        cap_hit = kept < self.target_groups
        trained = self._kept[: self.target_groups]
        n_pad = 0
        if cap_hit:  # kept < target, a multiple of the unit: the dropped groups always suffice
            n_pad = -kept % self.group_unit if kept else self.group_unit
        padding = self._dropped[:n_pad]
        groups = [*trained, *padding]
        flags = tuple(i >= len(trained) for i, g in enumerate(groups) for _ in range(len(g.prompts)))
        metrics = {
            f"{PREFIX}/gen_batches": float(self.gen_batches),
            f"{PREFIX}/kept_groups": float(kept),
            f"{PREFIX}/dropped_groups": float(len(self._dropped)),
            f"{PREFIX}/trained_groups": float(len(trained)),
            f"{PREFIX}/unused_groups": float(kept - len(trained)),
            f"{PREFIX}/padding_groups": float(len(padding)),
            f"{PREFIX}/cap_hit": float(cap_hit),
        }
        return Selection(ScoredRollouts.concat(groups), flags, cap_hit, metrics)


def merge_generation_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """One metric dict from the step's generation batches: ``timing/*`` and the counts of
    ``SUMMED_OVER_GENERATIONS`` are summed, everything else (means, throughputs) is averaged over the batches that
    report it.

    >>> merge_generation_metrics([{"timing/rollout_s": 2.0, "reward/score_mean": 0.5},
    ...                           {"timing/rollout_s": 3.0, "reward/score_mean": 0.0}])
    {'reward/score_mean': 0.25, 'timing/rollout_s': 5.0}
    """
    merged: dict[str, float] = {}
    for key in sorted({k for p in parts for k in p}):
        values = [p[key] for p in parts if key in p]
        summed = key.startswith("timing/") or key in SUMMED_OVER_GENERATIONS
        merged[key] = sum(values) if summed else sum(values) / len(values)
    return merged


def sample_filtered(next_batch: Callable[[], PromptBatch], roll_out: RollOut, groups: GroupFilter) -> Selection:
    """Roll out generation batches into ``groups`` until it is done, and return its selection, whose metrics also
    hold the generation batches' own (``merge_generation_metrics``). A hit cap is logged as a warning."""
    parts: list[dict[str, float]] = []
    while not groups.done:
        prompts, part = next_batch(), dict[str, float]()
        trajectories, results = roll_out(prompts, part, len(parts))
        groups.add(ScoredRollouts(prompts, tuple(trajectories), tuple(results)))
        parts.append(part)
    selection = groups.select()
    if selection.cap_hit:
        trained, padding = (int(selection.metrics[f"{PREFIX}/{k}_groups"]) for k in ("trained", "padding"))
        logger.warning(
            "%d generation batches (algorithm.filter_groups.max_num_gen_batches) kept %d of %d groups whose %s "
            "differs; training on those (%d flat padding groups left out of the loss)",
            *(groups.gen_batches, trained, groups.target_groups, groups.metric, padding),
        )
    metrics = {**merge_generation_metrics(parts), **selection.metrics}
    return Selection(selection.rollouts, selection.padding, selection.cap_hit, metrics)
