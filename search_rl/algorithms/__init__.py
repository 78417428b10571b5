"""The RL objective, in pure torch: advantage estimators, policy/value/entropy/KL losses, KL-in-reward control.

Nothing here knows about Ray, models or rollouts; everything takes (B, T) tensors plus an ``AlgorithmConfig``,
and every term is restricted to the model-generated tokens of a search response (see ``docs/algorithms.md``).
"""

from search_rl.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    AdvantageOutputs,
    EstimatorNeeds,
    compute_discounted_returns,
    compute_gae,
    estimator_needs,
    requires,
)
from search_rl.algorithms.gspo import compute_gspo_loss, sequence_log_ratio
from search_rl.algorithms.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
)
from search_rl.algorithms.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    aggregate_loss,
    compute_actor_loss,
    compute_value_loss,
    entropy_from_logits,
    estimate_kl,
    loss_mask_for,
)

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutputs",
    "EstimatorNeeds",
    "FixedKLController",
    "KLController",
    "aggregate_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_actor_loss",
    "compute_discounted_returns",
    "compute_gae",
    "compute_gspo_loss",
    "compute_value_loss",
    "entropy_from_logits",
    "estimate_kl",
    "estimator_needs",
    "loss_mask_for",
    "requires",
    "sequence_log_ratio",
]
