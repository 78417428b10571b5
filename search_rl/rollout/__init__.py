"""The rollout: the multi-turn search loop and what it talks to.

- ``generation_manager.py``: ``LLMGenerationManager``, the agent loop (token-in/token-out, observation mask 0).
- ``actions.py`` / ``observations.py`` / ``prompts.py``: parsing a turn, building ``<information>`` blocks, the
  prompt's token ids.
- ``backends/``: every search backend (http, web, simulated, replay) and ``build_retriever``, with the HTTP
  client of the Search-R1 ``/retrieve`` contract (``RetrieverClient``), the recording store and the cost meter.
- ``engines/``: generation engines behind one ``RolloutEngine`` protocol (``hf``, ``vllm``) and ``build_engine``.
"""

from search_rl.rollout.backends import RetrieverClient, RetrieverError
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.generation_manager import LLMGenerationManager, Retriever

__all__ = ["LLMGenerationManager", "Retriever", "RetrieverClient", "RetrieverError", "RolloutEngine"]
