"""The ``vllm`` engine (the ``[vllm]`` extra; on CPU ``make install-vllm``): vLLM imported only when one is built.

- ``engine.py``: ``VLLMEngine``, our ``SamplingParams`` mapped onto vLLM's offline API and back.
- ``weight_sync.py``: weight updates into a running ``vllm.LLM`` (``disk`` reload or CUDA ``ipc``) and the supported
  vLLM releases.
"""

from search_rl.rollout.engines.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine"]
