"""Shared fixtures: real retriever servers (uvicorn child processes) over the shipped corpus.

``retriever_url`` serves BM25 (index builds in about a second). ``dense_retriever_url`` serves the default dense
index (MiniLM + FAISS Flat), built from the corpus's shipped embeddings (``data/index/wiki_mini``, seconds) into the
user cache (~/.cache/search-rl/indexes). Everything the tests read is inside the repository or made by them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from retriever_server.launcher import RetrieverProcess, bm25_env
from retriever_server.settings import SHIPPED_CORPUS, default_cache_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


SERVER_FIXTURES = frozenset({"retriever_url", "dense_retriever_url"})
"""Fixtures that start a real retriever server: a test using one (directly or through another fixture) is marked
``integration``, so ``make test-fast`` (``-m "not integration and not ray and not slow"``) leaves it out."""
RAY_FIXTURES = frozenset({"ray_local"})
"""Fixtures that start a local Ray cluster: marked ``ray`` and ``integration``."""


LONGEST_FILES = (
    "tests/test_readme.py",
    "tests/search_rl/async_rollout/test_async_training.py",
    "tests/search_rl/trainer/test_train_e2e.py",
    "tests/retriever_server/serve/test_ray_serve.py",
    "tests/search_rl/test_multinode.py",
    "tests/search_rl/workers/test_fsdp.py",
)
"""The test files that took longest in a serial run (1-5 minutes each on 2 cores), scheduled before the rest."""


def _schedule_rank(item: pytest.Item) -> tuple[int, int]:
    """Sort key: the longest files first (in the order above), then the other slow tests, then the rest."""
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FILES:
        return 0, LONGEST_FILES.index(path)
    return (1 if item.get_closest_marker("slow") else 2), 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest first: with pytest-xdist (``make test``) a minutes-long test then starts while short ones are left to
    # fill the other worker, instead of running alone at the end.
    items.sort(key=_schedule_rank)
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & (SERVER_FIXTURES | RAY_FIXTURES):
            item.add_marker(pytest.mark.integration)
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def index_cache_dir() -> Path:
    """The user's index cache (what the server uses by default), reused across test runs."""
    return default_cache_dir() / "indexes"


@pytest.fixture(scope="session")
def retriever_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real uvicorn retriever serving BM25 over the shipped corpus."""
    env = bm25_env(tmp_path_factory.mktemp("bm25-index"), SHIPPED_CORPUS)
    log = tmp_path_factory.mktemp("logs") / "retriever-bm25.log"
    with RetrieverProcess(env=env, ready_timeout_s=180, log_path=log) as server:
        yield server.url


@pytest.fixture(scope="session")
def dense_retriever_url(index_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real uvicorn retriever serving the default dense index over the shipped corpus."""
    env = {
        "RETRIEVER_METHOD": "dense",
        "RETRIEVER_CORPUS_PATH": str(SHIPPED_CORPUS),
        "RETRIEVER_INDEX_DIR": str(index_cache_dir),
    }
    log = tmp_path_factory.mktemp("logs") / "retriever-dense.log"
    # 1500 s covers a machine where the shipped embeddings do not verify and the corpus is encoded (598 s on 2 cores)
    with RetrieverProcess(env=env, ready_timeout_s=1500, log_path=log) as server:
        yield server.url
