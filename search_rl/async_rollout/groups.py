"""A unit of generated work cut into GRPO groups (``split_groups``), the queue's item (``Group``), and a step's
groups put back together for the trainer (``assemble``).

A group is the ``rollout.n`` samples of one prompt, all sampled by one weight version: the queue holds, drops and
hands out only whole groups, so a group baseline never mixes samples of two steps or two policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from search_rl.batches import PromptBatch
from search_rl.datatypes import RolloutResult, Trajectory


@dataclass(frozen=True)
class Group:
    """The ``rollout.n`` samples of one prompt, as the queue holds them."""

    prompts: PromptBatch
    """(n,) the group's prompt rows."""
    trajectories: tuple[Trajectory, ...]
    """(n,) their trajectories."""
    shards: tuple[int, ...]
    """(n,) the shard of its unit each sample was generated in."""
    weight_version: int
    """The version of the weights that generated every sample."""
    unit: int
    """Index of the unit (the batch of prompts drawn) it came from."""
    shard_metrics: tuple[dict[str, float], ...]
    """The rollout metrics of each shard of its unit (shared by the unit's groups)."""


def split_groups(
    prompts: PromptBatch, trajectories: list[Trajectory], shards: list[int], version: int, unit: int, shard_metrics: Any
) -> list[Group]:
    """Cut a unit into its groups: runs of equal ``uid`` (the loader puts a prompt's samples next to each other)."""
    groups: list[Group] = []
    start = 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or prompts.uids[i] != prompts.uids[start]:
            rows = list(range(start, i))
            groups.append(
                Group(
                    prompts.select(rows),
                    tuple(trajectories[j] for j in rows),
                    tuple(shards[j] for j in rows),
                    version,
                    unit,
                    shard_metrics,
                )
            )
            start = i
    return groups


def assemble(groups: list[Group]) -> tuple[PromptBatch, list[RolloutResult]]:
    """The step's prompts and one ``RolloutResult`` per (unit, shard), in an order where the flattened trajectories
    line up with the prompts (the trainer concatenates the results' trajectories)."""
    buckets: dict[tuple[int, int], list[tuple[PromptBatch, Trajectory]]] = {}
    metrics: dict[tuple[int, int], dict[str, float]] = {}
    for g in groups:
        for j, (traj, shard) in enumerate(zip(g.trajectories, g.shards, strict=True)):
            key = (g.unit, shard)
            buckets.setdefault(key, []).append((g.prompts.select([j]), traj))
            metrics[key] = g.shard_metrics[shard]
    rows = [row for entries in buckets.values() for row, _ in entries]
    results = [RolloutResult([t for _, t in entries], dict(metrics[key])) for key, entries in buckets.items()]
    return PromptBatch.concat(rows), results
