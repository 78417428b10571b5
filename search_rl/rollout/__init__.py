"""Generation engines behind one ``RolloutEngine`` protocol: ``hf`` (transformers, CPU default) and ``vllm`` (GPU)."""

from search_rl.rollout.base import RolloutEngine

__all__ = ["RolloutEngine"]
