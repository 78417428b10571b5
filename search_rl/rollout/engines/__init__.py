"""Generation engines behind one ``RolloutEngine`` protocol, one subpackage per kind: ``hf/`` (transformers, any
causal LM), ``static/`` (Llama/Qwen2 over a static KV cache, CUDA-graph decoding on GPU) and ``vllm/``. The kinds
import only the shared modules here, never each other:

- ``base.py``: the contract (``RolloutEngine``, ``SessionEngine``, ``DecodeSession``).
- ``choice.py``: which engine runs where (``rollout.engine=auto``), the settings each refuses or ignores there, and
  the schedule the loop runs on it.
- ``factory.py``: ``build_engine``, the one engine builder (``rollout.assembly.build_rollout`` calls it).
- ``in_process.py``: what the ``hf`` and ``static`` engines share (a model in this process, weight updates).
- ``decoding.py``: their per-step sampling, stop checks and row bookkeeping; ``prefix_cache.py``: KV states reused
  across calls.
"""

from search_rl.rollout.engines.base import RolloutEngine

__all__ = ["RolloutEngine"]
