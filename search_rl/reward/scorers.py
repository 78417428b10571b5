"""``REWARDS``: scoring functions by name, and the choice of one per ``data_source`` (with a default).

Every entry has the signature ``(trajectory, ground_truth) -> RewardResult``; ``components`` always carries
``em``, ``subem``, ``f1``, ``format`` and ``answered`` for logging, whichever one the score is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from search_rl.datatypes import GroundTruth, RewardResult, Trajectory
from search_rl.registry import Registry
from search_rl.reward.format import format_ok
from search_rl.reward.qa_em import exact_match, extract_answer, f1_score, sub_exact_match
from search_rl.reward.shaping import shape_reward

logger = logging.getLogger(__name__)

RewardFn = Callable[[Trajectory, GroundTruth], RewardResult]
REWARDS: Registry[RewardFn] = Registry("reward function")

DEFAULT_REWARD = "qa_em"
"""Used for any data source not listed in ``DATA_SOURCE_REWARDS`` (and not overridden)."""
DATA_SOURCE_REWARDS: dict[str, str] = {
    source: "qa_em" for source in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
}
"""Built-in choice per data source; Search-R1 scores every QA source by exact match."""

QA_EM_FORMAT_SCORE = 0.2
"""``qa_em_format``'s fixed ``format_score`` (Search-R1's ``structure_format_score``)."""


def qa_components(trajectory: Trajectory, ground_truth: GroundTruth) -> dict[str, float]:
    """EM, sub-EM, F1 of the extracted answer, format check, and whether any answer was given."""
    texts = trajectory.model_texts
    answer = extract_answer(texts)
    return {
        "em": exact_match(answer, ground_truth.target),
        "subem": sub_exact_match(answer, ground_truth.target),
        "f1": f1_score(answer, ground_truth.target),
        "format": float(format_ok(texts)),
        "answered": float(answer is not None),
    }


@REWARDS.register("qa_em")
def qa_em(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """Exact match of the last model ``<answer>`` against the gold answers."""
    c = qa_components(trajectory, ground_truth)
    return RewardResult(c["em"], c)


@REWARDS.register("qa_subem")
def qa_subem(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """Substring exact match (a gold answer inside the predicted one)."""
    c = qa_components(trajectory, ground_truth)
    return RewardResult(c["subem"], c)


@REWARDS.register("qa_f1")
def qa_f1(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """Token F1 against the best-matching gold answer."""
    c = qa_components(trajectory, ground_truth)
    return RewardResult(c["f1"], c)


@REWARDS.register("qa_em_format")
def qa_em_format(trajectory: Trajectory, ground_truth: GroundTruth) -> RewardResult:
    """``qa_em`` shaped with ``format_score=0.2``: 1 (right, well-formed), 0.8 (right, malformed), 0.2 (wrong,
    well-formed), 0 (wrong, malformed). A fixed preset for one data source; the way to shape every source is
    ``reward.format_score`` (``search_rl/reward/shaping.py``), and the two do not combine (``RewardConfig``)."""
    return shape_reward(qa_em(trajectory, ground_truth), format_score=QA_EM_FORMAT_SCORE)


def reward_fn_for(
    data_source: str, overrides: Mapping[str, str] | None = None, default: str = DEFAULT_REWARD
) -> RewardFn:
    """The scoring function of ``data_source``: ``overrides`` first, then ``DATA_SOURCE_REWARDS``, then ``default``.

    Names may be registry keys or ``"pkg.module:function"`` import strings. Unknown sources never crash.
    """
    name = (overrides or {}).get(data_source) or DATA_SOURCE_REWARDS.get(data_source)
    if name is None:
        logger.debug("data source %r has no reward entry; using %r", data_source, default)
        name = default
    return REWARDS.get(name)


def compute_reward(
    trajectory: Trajectory, ground_truth: GroundTruth, overrides: Mapping[str, str] | None = None
) -> RewardResult:
    """Score one trajectory with the function chosen for its ``ground_truth.data_source``."""
    return reward_fn_for(ground_truth.data_source, overrides)(trajectory, ground_truth)
