"""The rollout: the multi-turn search loop and what it talks to.

- ``generation_manager.py``: ``LLMGenerationManager``, the agent loop (token-in/token-out, observation mask 0).
- ``actions.py`` / ``observations.py``: parsing a turn, building ``<information>`` blocks (a prompt's token ids come
  from ``search_rl.prompt_data.encode_prompt``).
- ``tools/``: the tool seam the loop drives (``search``, ``open``, tools from ``rollout.tools``) and the two action
  formats (Search-R1 tags, the model's chat-template tool calls); docs/tools.md.
- ``backends/``: every search backend (http, web, simulated, replay) and ``build_retriever``, with the HTTP
  client of the Search-R1 ``/retrieve`` contract (``RetrieverClient``), the recording store and the cost meter.
- ``engines/``: generation engines behind one ``RolloutEngine`` protocol, one subpackage per kind (``hf/``,
  ``static/``, ``vllm/``), which engine runs where (``choice``) and ``build_engine``.
- ``assembly.py``: ``build_rollout``, the one place engine + backend + manager are put together (actor workers,
  generators, evaluation, benches).
"""

from search_rl.rollout.backends import RetrieverClient, RetrieverError
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.generation_manager import LLMGenerationManager, Retriever

__all__ = ["LLMGenerationManager", "Retriever", "RetrieverClient", "RetrieverError", "RolloutEngine"]
