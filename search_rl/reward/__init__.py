"""Rewards: QA answer scoring (EM / sub-EM / F1), the tag-format check, ``REWARDS`` by data source, and the
shaping (format reward, partial credit, overlong penalty) applied on top of the chosen function."""

from search_rl.reward.format import format_ok
from search_rl.reward.qa_em import (
    JUDGEMENT_ANSWERS,
    exact_match,
    extract_answer,
    f1_score,
    is_judgement,
    normalize_answer,
    sub_exact_match,
)
from search_rl.reward.scorers import REWARDS, RewardFn, compute_reward, reward_fn_for
from search_rl.reward.shaping import (
    PARTIAL_CREDITS,
    apply_overlong_penalty,
    apply_search_penalty,
    overlong_penalty,
    shape_reward,
    shaping_enabled,
)

__all__ = [
    "JUDGEMENT_ANSWERS",
    "PARTIAL_CREDITS",
    "REWARDS",
    "RewardFn",
    "apply_overlong_penalty",
    "apply_search_penalty",
    "compute_reward",
    "exact_match",
    "extract_answer",
    "f1_score",
    "format_ok",
    "is_judgement",
    "normalize_answer",
    "overlong_penalty",
    "reward_fn_for",
    "shape_reward",
    "shaping_enabled",
    "sub_exact_match",
]
