"""Rewards: QA answer scoring (EM / sub-EM / F1), the tag-format check, and ``REWARDS`` by data source."""

from search_rl.reward.format import format_ok
from search_rl.reward.qa_em import exact_match, extract_answer, f1_score, normalize_answer, sub_exact_match
from search_rl.reward.registry import REWARDS, RewardFn, compute_reward, reward_fn_for

__all__ = [
    "REWARDS",
    "RewardFn",
    "compute_reward",
    "exact_match",
    "extract_answer",
    "f1_score",
    "format_ok",
    "normalize_answer",
    "reward_fn_for",
    "sub_exact_match",
]
