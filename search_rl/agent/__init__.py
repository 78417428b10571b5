"""The search agent: tag parsing, observations, the retriever client and the multi-turn generation manager."""

from search_rl.agent.generation_manager import LLMGenerationManager, Retriever
from search_rl.agent.retriever_client import RetrieverClient, RetrieverError

__all__ = ["LLMGenerationManager", "Retriever", "RetrieverClient", "RetrieverError"]
