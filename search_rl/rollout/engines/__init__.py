"""Generation engines behind one ``RolloutEngine`` protocol: ``hf`` (transformers, CPU default), ``static``
(transformers over a static KV cache, CUDA-graph decoding on GPU) and ``vllm``; ``factory.build_engine`` is the one
place that picks and builds one."""

from search_rl.rollout.engines.base import RolloutEngine

__all__ = ["RolloutEngine"]
