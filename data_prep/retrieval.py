"""The retriever for ``data_prep``'s synchronous scripts: the rollout's ``RetrieverClient`` behind a blocking call.

One HTTP client for the whole project (timeouts, retries, failover, ``RetrieverError``): the scripts that query a
running retriever (``synth_sft``, ``ceiling``) use it through ``blocking_search`` instead of a client of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from search_rl.datatypes import Passage
from search_rl.rollout.backends import RetrieverClient

SearchFn = Callable[[list[str]], list[list[Passage]]]
"""Takes a batch of queries and returns, per query, its passages best first."""


def blocking_search(client: RetrieverClient, topk: int) -> SearchFn:
    """``search(queries)``: ``client.search(queries, topk)`` run to completion in its own event loop.

    Raises (from the returned function):
        RetrieverError: the retriever still fails after the client's retries, or answers something unusable.
    """

    async def search_and_close(queries: list[str]) -> list[list[Passage]]:
        try:
            return await client.search(queries, topk)
        finally:
            await client.aclose()  # each call runs its own event loop; its HTTP client goes with it

    def search(queries: list[str]) -> list[list[Passage]]:
        return asyncio.run(search_and_close(queries))

    return search
