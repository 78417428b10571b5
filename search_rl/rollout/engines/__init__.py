"""Generation engines behind one ``RolloutEngine`` protocol: ``hf`` (transformers, CPU default) and ``vllm``;
``factory.build_engine`` is the one place that picks and builds one."""

from search_rl.rollout.engines.base import RolloutEngine

__all__ = ["RolloutEngine"]
