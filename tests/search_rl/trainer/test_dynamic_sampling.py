"""DAPO dynamic sampling, the pure part: which groups have a spread, filling a batch over generation batches, the cap
(train on what was kept, padding to an even split marked), unique uids across batches, metric merging.

Run: python -m pytest tests/search_rl/trainer/test_dynamic_sampling.py -q
"""

from __future__ import annotations

import doctest

import pytest
import torch

import search_rl.trainer.dynamic_sampling as ds
from search_rl.batches import PromptBatch
from search_rl.datatypes import RewardResult, Trajectory, TrajectoryStats
from search_rl.trainer.dynamic_sampling import GroupFilter, ScoredRollouts, groups_with_spread, metric_values

N = 2  # samples per prompt


def _rollouts(groups: dict[str, list[float]], em: dict[str, list[float]] | None = None) -> ScoredRollouts:
    """One generation batch: each uid's samples with the given scores (and EM components); a trajectory's single
    response token is its row number, so rows can be traced through the selection."""
    uids = [u for u, scores in groups.items() for _ in scores]
    scores = [s for ss in groups.values() for s in ss]
    ems = [e for ee in em.values() for e in ee] if em else [0.0] * len(scores)
    n = len(uids)
    prompts = PromptBatch(((1,),) * n, tuple(uids), ("nq",) * n, (("a",),) * n, ("q",) * n, tuple(range(n)))
    trajs = tuple(
        Trajectory(torch.tensor([1]), torch.tensor([i]), torch.tensor([1]), None, (), None, "answer", TrajectoryStats())
        for i in range(n)
    )
    results = tuple(RewardResult(s, {"em": e}) for s, e in zip(scores, ems, strict=True))
    return ScoredRollouts(prompts, trajs, results)


def _rows(sel: ds.Selection) -> list[int]:
    return [int(t.response_ids[0]) for t in sel.rollouts.trajectories]


def test_groups_with_spread_by_score_or_component():
    assert groups_with_spread([1.0, 0.0, 0.5, 0.5, 0.0, 0.0], ["a", "a", "b", "b", "c", "c"]) == [True, False, False]
    batch = _rollouts({"a": [0.2, 0.0], "b": [1.0, 1.0]}, em={"a": [0.0, 0.0], "b": [1.0, 1.0]})
    # a's scores differ (format reward), its EM does not: filtering on em drops it, on score keeps it
    assert groups_with_spread(metric_values(batch.results, "score"), batch.prompts.uids) == [True, False]
    assert groups_with_spread(metric_values(batch.results, "em"), batch.prompts.uids) == [False, False]
    with pytest.raises(ValueError, match="algorithm.filter_groups.metric='f1' is not a component"):
        metric_values(batch.results, "f1")


def test_fills_the_batch_from_further_generation_batches():
    f = GroupFilter(target_groups=3, max_gen_batches=5, metric="score")
    f.add(_rollouts({"a": [1, 0], "b": [0, 0], "c": [1, 1]}))  # keeps a
    assert not f.done
    f.add(_rollouts({"d": [0, 0], "e": [0, 1], "f": [1, 0]}))  # keeps e, f: 3 kept, done after 2 of 5
    assert f.done
    sel = f.select()
    assert sel.rollouts.prompts.uids == ("a", "a", "e", "e", "f", "f")
    assert _rows(sel) == [0, 1, 2, 3, 4, 5]  # a = rows 0-1 of batch 1, e and f = rows 2-5 of batch 2
    assert not sel.cap_hit and sel.padding == (False,) * 6
    assert sel.metrics == {
        "dynamic_sampling/gen_batches": 2.0,
        "dynamic_sampling/kept_groups": 3.0,
        "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/trained_groups": 3.0,
        "dynamic_sampling/unused_groups": 0.0,
        "dynamic_sampling/padding_groups": 0.0,
        "dynamic_sampling/cap_hit": 0.0,
    }


def test_surplus_groups_of_the_last_batch_are_unused():
    f = GroupFilter(target_groups=2, max_gen_batches=3, metric="score")
    f.add(_rollouts({"a": [1, 0], "b": [0, 1]}))
    assert f.done  # the filter takes no more batches once done
    with pytest.raises(RuntimeError, match="after the filter is done"):
        f.add(_rollouts({"c": [1, 0], "d": [0, 1]}))
    f2 = GroupFilter(target_groups=2, max_gen_batches=3, metric="score")
    f2.add(_rollouts({"a": [1, 0], "b": [0, 0]}))
    f2.add(_rollouts({"c": [1, 0], "d": [0, 1]}))
    sel = f2.select()
    assert sel.rollouts.prompts.uids == ("a", "a", "c", "c")
    assert sel.metrics["dynamic_sampling/unused_groups"] == 1.0 and sel.metrics["dynamic_sampling/kept_groups"] == 3


def test_cap_hit_trains_on_the_kept_groups_padded_to_an_even_split():
    # 4 groups per batch over 2 workers with rollout.n = 1 would need a unit of 2 groups; here unit 2, 1 kept:
    # the kept group plus one dropped (padding) group, in that order.
    f = GroupFilter(target_groups=4, max_gen_batches=2, metric="score", group_unit=2)
    f.add(_rollouts({"a": [0, 0], "b": [1, 1], "c": [0, 0], "d": [0, 0]}))
    f.add(_rollouts({"e": [0, 0], "f": [0, 1], "g": [1, 1], "h": [0, 0]}))
    assert f.done
    sel = f.select()
    assert sel.cap_hit and sel.rollouts.prompts.uids == ("f", "f", "a", "a")
    assert sel.padding == (False, False, True, True)
    assert sel.metrics["dynamic_sampling/cap_hit"] == 1.0
    assert (sel.metrics["dynamic_sampling/trained_groups"], sel.metrics["dynamic_sampling/padding_groups"]) == (1, 1)
    assert sel.metrics["dynamic_sampling/dropped_groups"] == 7.0


def test_cap_hit_with_nothing_kept_gives_one_unit_of_padding():
    f = GroupFilter(target_groups=2, max_gen_batches=1, metric="score", group_unit=2)
    f.add(_rollouts({"a": [0, 0], "b": [1, 1]}))
    sel = f.select()
    assert sel.cap_hit and sel.rollouts.prompts.uids == ("a", "a", "b", "b") and all(sel.padding)
    one = GroupFilter(target_groups=2, max_gen_batches=1, metric="score")
    one.add(_rollouts({"a": [0, 0], "b": [1, 1]}))
    assert one.select().rollouts.prompts.uids == ("a", "a")


def test_a_prompt_seen_again_in_a_later_batch_gets_its_own_group():
    f = GroupFilter(target_groups=2, max_gen_batches=3, metric="score")
    f.add(_rollouts({"a": [1, 0], "b": [0, 0]}))
    f.add(_rollouts({"a": [0, 1], "c": [0, 0]}))  # the loader wrapped into the next epoch: "a" again
    sel = f.select()
    assert sel.rollouts.prompts.uids == ("a", "a", "a#gen1", "a#gen1")


def test_bad_sizes_and_order_are_refused():
    with pytest.raises(ValueError, match="do not split into units of 3"):
        GroupFilter(target_groups=4, max_gen_batches=1, metric="score", group_unit=3)
    with pytest.raises(RuntimeError, match="before any generation batch"):
        GroupFilter(target_groups=1, max_gen_batches=1, metric="score").select()


def test_merge_generation_metrics_sums_times_and_counts_and_averages_the_rest():
    merged = ds.merge_generation_metrics(
        [
            {"timing/rollout_s": 1.0, "rollout/retriever_errors": 2.0, "rollout/gen_tokens_per_s": 10.0},
            {"timing/rollout_s": 2.5, "rollout/retriever_errors": 1.0, "rollout/gen_tokens_per_s": 30.0, "x": 4.0},
        ]
    )
    assert merged == {
        "timing/rollout_s": 3.5,
        "rollout/retriever_errors": 3.0,
        "rollout/gen_tokens_per_s": 20.0,
        "x": 4.0,
    }


def test_sample_filtered_rolls_out_until_done_and_merges_the_batches_metrics(caplog):
    batches = iter(
        [_rollouts({"a": [0, 0], "b": [1, 0]}), _rollouts({"c": [1, 1], "d": [0, 0]}), _rollouts({"e": [0, 1]})]
    )
    salts = []

    def roll_out(prompts, metrics, salt):
        salts.append(salt)
        metrics["timing/rollout_s"], metrics["reward/score_mean"] = 1.0, float(salt)
        rollouts = current[prompts.uids]
        return rollouts.trajectories, rollouts.results

    def next_batch():
        batch = next(batches)
        current[batch.prompts.uids] = batch
        return batch.prompts

    current: dict = {}
    sel = ds.sample_filtered(next_batch, roll_out, GroupFilter(target_groups=2, max_gen_batches=5, metric="score"))
    assert salts == [0, 1, 2] and sel.rollouts.prompts.uids == ("b", "b", "e", "e") and not sel.cap_hit
    assert sel.metrics["timing/rollout_s"] == 3.0 and sel.metrics["reward/score_mean"] == 1.0
    assert sel.metrics["dynamic_sampling/gen_batches"] == 3.0 and not caplog.records
    batches = iter([_rollouts({"a": [0, 0], "b": [1, 1]})])
    capped = ds.sample_filtered(next_batch, roll_out, GroupFilter(target_groups=2, max_gen_batches=1, metric="score"))
    assert capped.cap_hit and "kept 0 of 2 groups whose score differs" in caplog.text


def test_docstring_examples():
    result = doctest.testmod(ds)
    assert result.attempted > 0 and result.failed == 0
