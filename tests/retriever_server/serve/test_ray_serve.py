"""The Ray Serve retriever on a local two-node Ray cluster (``ray start --head`` + ``ray start --address``, one CPU
each): two Flat shards, one per node, answer ``POST /retrieve`` with the same top-k as one Flat index over the same
vectors searched in this process. ``python -m pytest tests/retriever_server/serve/test_ray_serve.py`` (about a minute).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest

from retriever_server.index.convert import main as convert_main
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.launcher import free_port
from retriever_server.retrievers.encoder import Encoder
from retriever_server.retrievers.sharded import merge_topk

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]

ROWS = 600
QUERIES = ["who wrote the theory of relativity", "capital city of australia", "largest planet in the solar system",
           "when did world war 2 end", "what is photosynthesis"]  # fmt: skip
# loopback-only nodes: no token authentication, no usage stats
RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=RAY_ENV, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 45) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def two_nodes(tmp: Path) -> Iterator[str]:
    """A head node and a second node on this machine, one CPU each; yields the cluster address."""
    port = free_port()
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    head = ["ray", "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir=/tmp/ray-rs-{port}"]
    nodes = [_start([*head, *common], tmp / "head.log")]
    try:
        address = f"127.0.0.1:{port}"
        nodes.append(_start(["ray", "start", f"--address={address}", *common], tmp / "node.log"))
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)


def wait_ready(url: str, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{url}/health", timeout=10)
            if r.status_code == 200 and "retriever serving on" in log.read_text():  # serve.run returned
                return dict(r.json())
        time.sleep(1)
    raise TimeoutError(log.read_text()[-3000:])


def test_two_shards_on_two_nodes_match_one_index(tmp_path: Path, make_corpus: Callable[[int], Path]) -> None:
    corpus = make_corpus(ROWS)
    vectors = np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:ROWS].astype(np.float32)
    np.save(tmp_path / "emb.npy", vectors)
    out = tmp_path / "wiki.index"
    assert convert_main(["--vectors", str(tmp_path / "emb.npy"), "--factory", "Flat", "--out", str(out),
                         "--shards", "2", "--corpus", str(corpus)]) == 0  # fmt: skip
    shards = [f"{tmp_path}/wiki-shard{i}of2.index,{tmp_path}/wiki-shard{i}of2.store" for i in range(2)]

    single = faiss.IndexFlatIP(384)
    single.add(vectors)
    scores, positions = single.search(Encoder("all-MiniLM-L6-v2").encode_queries(QUERIES), 5)
    rows = load_corpus(corpus, tmp_path / "stores")
    expected = [[rows.document(int(p)) for p in row] for row in positions]

    port = free_port()
    env = {"RETRIEVER_INDEX_DIR": str(tmp_path / "cache"), "RETRIEVER_SHOW_PROGRESS": "false"}
    with two_nodes(tmp_path) as address:
        cmd = [sys.executable, "-m", "retriever_server.serve.deployment", "--address", address, "--port", str(port),
               "--ingress-cpus", "0", "--shard-cpus", "1", *(a for s in shards for a in ("--shard", s))]  # fmt: skip
        log = tmp_path / "serve.log"
        server = subprocess.Popen(cmd, env={**RAY_ENV, **env}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        try:
            health = wait_ready(f"http://127.0.0.1:{port}", server, log)
            body = {"queries": QUERIES, "topk": 5, "return_scores": True}
            answer = httpx.post(f"http://127.0.0.1:{port}/retrieve", json=body, timeout=60)
            bad = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": [""]}, timeout=60)
        finally:
            _stop(server, signal.SIGINT, timeout_s=60)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "queries", 0], bad.text
    assert health["num_documents"] == ROWS
    assert [s["rows"] for s in health["shards"]] == [300, 300]
    assert health["shards"][0]["node"] != health["shards"][1]["node"], "both shards ran on one node"
    assert [[hit["document"] for hit in row] for row in result] == expected
    assert np.allclose([[hit["score"] for hit in row] for row in result], scores, atol=1e-5)
    assert any(p >= 300 for p in positions.ravel()) and any(p < 300 for p in positions.ravel())


def test_merge_fills_from_either_shard_and_skips_empty_slots() -> None:
    s, p = merge_topk(
        [np.array([[0.5, -np.inf]], np.float32), np.array([[0.9, 0.1]], np.float32)],
        [np.array([[3, -1]]), np.array([[10, 11]])],
        topk=4,
    )
    assert p.tolist() == [[10, 3, 11, -1]]
    assert s[0, :3].tolist() == pytest.approx([0.9, 0.5, 0.1]) and s[0, 3] == -np.inf
