"""The asynchronous modes' bounded group queue and the coordinator's pure helpers (no Ray, no models).

- ``GroupQueue``: the bound counts ready + reserved groups (hand-checked numbers), stale groups are dropped at take
  time and counted, the oldest acceptable groups come first, a timed-out take loses nothing.
- A property test: producer threads reserving and delivering units of random sizes at random speeds against a slow
  consumer; the queue never holds more than its capacity, every group delivered is taken or dropped exactly once,
  and no taken group is staler than the bound.
- ``split_groups`` / ``assemble``: a unit cut into whole groups, and a step's groups put back in an order where the
  flattened trajectories line up with the prompts.

Run: python -m pytest tests/search_rl/async_rollout/test_async_queue.py -q   (a few seconds)
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_rl.async_rollout import GroupQueue
from search_rl.async_rollout.groups import assemble, split_groups
from search_rl.batches import PromptBatch
from search_rl.datatypes import Trajectory, TrajectoryStats


@dataclass(frozen=True)
class Item:
    name: str
    weight_version: int


def test_capacity_counts_ready_and_reserved_groups():
    q: GroupQueue[Item] = GroupQueue(capacity=4)
    assert q.reserve(3)
    assert not q.reserve(2)  # 3 reserved + 2 > 4
    assert q.free() == 1
    q.put([Item("a", 0), Item("b", 0)], reserved=3)  # one group of the unit was not delivered: room given back
    assert (len(q), q.reserved, q.free()) == (2, 0, 2)
    assert q.reserve(2) and not q.reserve(1)
    q.release(2)
    assert q.free() == 2
    with pytest.raises(ValueError, match="reservation"):
        q.put([Item("c", 0)], reserved=1)  # nothing reserved
    assert q.max_depth == 4


def test_take_drops_stale_groups_and_serves_the_oldest_first():
    q: GroupQueue[Item] = GroupQueue(capacity=8)
    q.reserve(5)
    q.put([Item("v2a", 2), Item("v0", 0), Item("v1a", 1), Item("v2b", 2), Item("v1b", 1)], reserved=5)
    taken = q.take(3, current_version=2, max_staleness=1, timeout_s=0.1)
    assert [g.name for g in taken.dropped] == ["v0"]  # 2 - 0 > 1
    assert [g.name for g in taken.groups] == ["v1a", "v1b", "v2a"]  # by version, then arrival
    assert taken.depth == 5
    assert [g.name for g in q.take(1, 2, 0, 0.1).groups] == ["v2b"]


def test_a_timed_out_take_returns_nothing_and_keeps_the_fresh_groups():
    q: GroupQueue[Item] = GroupQueue(capacity=4)
    q.reserve(1)
    q.put([Item("a", 3)], reserved=1)
    start = time.monotonic()
    taken = q.take(2, current_version=3, max_staleness=0, timeout_s=0.2)
    assert taken.groups == [] and taken.dropped == []
    assert time.monotonic() - start > 0.15  # it waited for its timeout (an upper bound would only measure load)
    assert len(q) == 1


def test_a_waiting_take_wakes_when_the_groups_arrive():
    q: GroupQueue[Item] = GroupQueue(capacity=4)
    q.reserve(2)
    threading.Timer(0.1, lambda: q.put([Item("a", 0), Item("b", 0)], reserved=2)).start()
    taken = q.take(2, current_version=0, max_staleness=0, timeout_s=5.0)
    assert [g.name for g in taken.groups] == ["a", "b"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(2, 6),
    unit=st.integers(1, 2),
    producers=st.integers(1, 3),
    units_each=st.integers(2, 5),
    max_staleness=st.integers(0, 2),
    seed=st.integers(0, 10_000),
)
def test_bounded_under_a_slow_consumer(capacity, unit, producers, units_each, max_staleness, seed):
    """Producers tag units with the version they saw when starting, like generators; the consumer bumps the version
    after each take, like the trainer. The bound holds at every moment a monitor looks, and nothing is lost."""
    q: GroupQueue[Item] = GroupQueue(capacity)
    rng = random.Random(seed)
    delays = [[rng.uniform(0, 0.004) for _ in range(units_each)] for _ in range(producers)]
    version = [0]
    done = threading.Event()
    peaks: list[int] = []

    def produce(p: int) -> None:
        for k in range(units_each):
            while not q.reserve(unit):  # back-pressure: no room, no work
                time.sleep(0.001)  # the coordinator also retries later rather than block
            v = version[0]
            time.sleep(delays[p][k])
            q.put([Item(f"{p}-{k}-{i}", v) for i in range(unit)], reserved=unit)

    def monitor() -> None:
        while not done.is_set():
            peaks.append(len(q) + q.reserved)
            time.sleep(0.0005)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    watcher = threading.Thread(target=monitor)
    for t in [*threads, watcher]:
        t.start()
    total = producers * units_each * unit
    taken: list[Item] = []
    dropped: list[Item] = []
    while len(taken) + len(dropped) < total:
        got = q.take(1, version[0], max_staleness, timeout_s=0.05)
        dropped += got.dropped
        for g in got.groups:
            assert version[0] - g.weight_version <= max_staleness
            taken.append(g)
            time.sleep(0.002)  # the slow consumer
            version[0] += 1
        if not got.groups and all(not t.is_alive() for t in threads):
            dropped += q.take(10**6, version[0], -1, 0.0).dropped  # drain: everything left is "too old" for -1
    done.set()
    for t in [*threads, watcher]:
        t.join()
    assert max(peaks) <= capacity and q.max_depth <= capacity
    names = [g.name for g in taken + dropped]
    assert sorted(names) == sorted(
        {f"{p}-{k}-{i}" for p in range(producers) for k in range(units_each) for i in range(unit)}
    )


def _trajectory(token: int) -> Trajectory:
    ids = torch.tensor([token, token + 1])
    return Trajectory(
        torch.tensor([1, 2]), ids, torch.ones(2, dtype=torch.long), None, (), None, "eos", TrajectoryStats()
    )


def _prompts(uids: list[str]) -> PromptBatch:
    n = len(uids)
    return PromptBatch(
        tuple((i + 1,) for i in range(n)), tuple(uids), ("nq",) * n, (("a",),) * n, ("q",) * n, tuple(range(n))
    )


def test_a_unit_is_cut_into_whole_groups_and_reassembled_in_line():
    prompts = _prompts(["a", "a", "b", "b", "c", "c"])
    trajs = [_trajectory(10 * i) for i in range(6)]
    groups = split_groups(prompts, trajs, [0, 0, 0, 1, 1, 1], 3, unit=7, shard_metrics=({"m": 1.0}, {"m": 2.0}))
    assert [g.prompts.uids for g in groups] == [("a", "a"), ("b", "b"), ("c", "c")]
    assert groups[1].shards == (0, 1) and groups[1].trajectories == (trajs[2], trajs[3])
    other_prompts, other_trajs = _prompts(["d", "d"]), [_trajectory(99), _trajectory(98)]
    other = split_groups(other_prompts, other_trajs, [0, 0], 2, unit=8, shard_metrics=({"m": 5.0},))
    step_prompts, results = assemble([groups[2], other[0], groups[0]])
    flat = [t for r in results for t in r.trajectories]
    pairs = {id(t): (u, ids) for t, u, ids in zip(trajs, prompts.uids, prompts.prompt_ids, strict=True)}
    pairs |= {
        id(t): (u, ids) for t, u, ids in zip(other_trajs, other_prompts.uids, other_prompts.prompt_ids, strict=True)
    }
    # every trajectory sits next to its own prompt: results are (unit, shard) buckets in first-seen order
    assert [pairs[id(t)] for t in flat] == list(zip(step_prompts.uids, step_prompts.prompt_ids, strict=True))
    assert step_prompts.uids == ("c", "c", "d", "d", "a", "a")
    assert [r.metrics["m"] for r in results] == [2.0, 5.0, 1.0]
    assert [len(r.trajectories) for r in results] == [2, 2, 2]
