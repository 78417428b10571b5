"""Fixtures for the retriever tests: a small real corpus cut from the shipped one, and Ray clusters with the Ray Serve
retriever on them (Ray's CLI for this interpreter, ``ray_cli``: an unactivated venv, or one over system packages,
works)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from retriever_server.index.convert import main as convert_main
from retriever_server.index.shipped_embeddings import SHIPPED_EMBEDDINGS_DIR
from retriever_server.launcher import free_port
from retriever_server.serve.ray_cli import ray_cli
from retriever_server.settings import SHIPPED_CORPUS

RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
"""Loopback-only nodes: no token authentication, no usage stats."""
SERVE_ROWS = 600
"""Rows of the shared Ray Serve retriever (two Flat shards of 300, from the shipped embeddings)."""
SERVE_ARTICLE = range(296, 304)
"""Rows of the shared Ray Serve retriever's corpus given one title: an article of 8 passages that crosses the shard
boundary (row 300); every shipped article has one passage."""


def read_shipped_rows(n: int | None = None) -> list[dict[str, str]]:
    rows = []
    with gzip.open(SHIPPED_CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if n is not None and len(rows) >= n:
                break
    return rows


def write_corpus(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def make_corpus(tmp_path: Path) -> Callable[[int], Path]:
    """``make_corpus(n)``: the first ``n`` passages of the shipped corpus (real Wikipedia text) as plain jsonl."""

    def make(n: int) -> Path:
        return write_corpus(tmp_path / f"corpus-{n}.jsonl", read_shipped_rows(n))

    return make


@pytest.fixture
def small_corpus(make_corpus: Callable[[int], Path]) -> Path:
    """The first 300 passages of the shipped corpus."""
    return make_corpus(300)


def shipped_vectors(rows: int) -> np.ndarray:
    """The shipped MiniLM vectors of the first ``rows`` passages, float32 ``(rows, 384)``."""
    return np.load(SHIPPED_EMBEDDINGS_DIR / "wiki_mini" / "embeddings-000.npy")[:rows].astype(np.float32)


def write_shards(folder: Path, corpus: Path, rows: int, shards: int = 2) -> list[str]:
    """Flat shards of the shipped vectors of ``corpus``'s rows, with their stores; ``--shard`` values."""
    np.save(folder / "emb.npy", shipped_vectors(rows))
    out = folder / "wiki.index"
    argv = ["--vectors", str(folder / "emb.npy"), "--factory", "Flat", "--out", str(out), "--shards", str(shards),
            "--corpus", str(corpus)]  # fmt: skip
    assert convert_main(argv) == 0
    return [f"{folder}/wiki-shard{i}of{shards}.index,{folder}/wiki-shard{i}of{shards}.store" for i in range(shards)]


def start_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group, output to ``log``."""
    return subprocess.Popen(
        cmd, env=env or RAY_ENV, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 45) -> None:
    """Signal ``process``'s group, then kill it if it has not exited within ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _start_node(cmd: list[str], log: Path, timeout_s: float = 240, tries: int = 2) -> subprocess.Popen[bytes]:
    """Start a Ray node and wait until it says it runs; on a loaded machine a node can time out waiting for the head
    (``The current node timed out during startup``), so a node that exits is started again, ``tries`` times in all."""
    for _ in range(tries):
        node = start_logged(cmd, log)
        deadline = time.monotonic() + timeout_s
        while node.poll() is None and time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text(errors="replace"):
                return node
            time.sleep(1)
        stop_group(node)
    raise RuntimeError(f"{' '.join(cmd)} did not start ({tries} tries):\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def ray_nodes(tmp: Path, nodes: int = 1) -> Iterator[str]:
    """A head node and ``nodes - 1`` more on this machine, one CPU each, started one after another; yields the
    cluster address."""
    port = free_port()
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    ray = ray_cli()
    head = [*ray, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir=/tmp/ray-rs-{port}"]
    started = [_start_node([*head, *common], tmp / "head.log")]
    try:
        address = f"127.0.0.1:{port}"
        for i in range(1, nodes):
            started.append(_start_node([*ray, "start", f"--address={address}", *common], tmp / f"node{i}.log"))
        yield address
    finally:
        for node in reversed(started):
            stop_group(node)


def wait_serving(url: str, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> dict:
    """Poll ``/health`` until the Serve app answers 200 and ``serve.run`` has returned; its body."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{url}/health", timeout=10)
            if r.status_code == 200 and "retriever serving on" in log.read_text():
                return dict(r.json())
        time.sleep(1)
    raise TimeoutError(log.read_text()[-3000:])


@contextlib.contextmanager
def serve_shards(
    tmp: Path, corpus: Path, rows: int, address: str, cpus: tuple[float, float], env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict]]:
    """Two Flat shards of ``corpus``'s first ``rows`` rows served by ``python -m retriever_server.serve.deployment`` on
    the cluster at ``address``, ``cpus`` = (ingress, shard) CPUs per replica; yields its URL and first ``/health``."""
    shards = write_shards(tmp, corpus, rows)
    port = free_port()
    cmd = [sys.executable, "-m", "retriever_server.serve.deployment", "--address", address, "--port", str(port),
           "--ingress-cpus", str(cpus[0]), "--shard-cpus", str(cpus[1])]  # fmt: skip
    cmd += [a for s in shards for a in ("--shard", s)]
    log = tmp / "serve.log"
    settings = {"RETRIEVER_INDEX_DIR": str(tmp / "cache"), "RETRIEVER_SHOW_PROGRESS": "false", **(env or {})}
    server = start_logged(cmd, log, {**RAY_ENV, **settings})
    try:
        url = f"http://127.0.0.1:{port}"
        yield url, wait_serving(url, server, log)
    finally:
        stop_group(server, signal.SIGINT, timeout_s=60)


@pytest.fixture
def ray_cluster() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """``with ray_cluster(tmp_path, nodes=2) as address:`` a local Ray cluster (:func:`ray_nodes`)."""
    return ray_nodes


@pytest.fixture
def ray_serve_shards() -> Callable[..., contextlib.AbstractContextManager[tuple[str, dict]]]:
    """``with ray_serve_shards(tmp_path, corpus, rows, address, (ingress_cpus, shard_cpus)) as (url, health):`` the
    Ray Serve retriever over two Flat shards (:func:`serve_shards`)."""
    return serve_shards


@pytest.fixture(scope="session")
def ray_serve_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus of ``ray_serve_url``: the first ``SERVE_ROWS`` shipped passages, rows ``SERVE_ARTICLE`` retitled
    as one article (their vectors stay the shipped ones)."""
    rows = read_shipped_rows(SERVE_ROWS)
    for i in SERVE_ARTICLE:
        rows[i] = {"id": rows[i]["id"], "contents": '"Crossing article"\n' + rows[i]["contents"].partition("\n")[2]}
    return write_corpus(tmp_path_factory.mktemp("ray-serve-corpus") / "corpus.jsonl", rows)


@pytest.fixture(scope="session")
def ray_serve_url(tmp_path_factory: pytest.TempPathFactory, ray_serve_corpus: Path) -> Iterator[str]:
    """URL of the Ray Serve retriever on a one-node, one-CPU cluster: two Flat shards over ``ray_serve_corpus``,
    a quarter CPU per replica, no result cache (so every request is searched)."""
    tmp, no_cache = tmp_path_factory.mktemp("ray-serve"), {"RETRIEVER_CACHE_SIZE": "0"}
    with (
        ray_nodes(tmp) as address,
        serve_shards(tmp, ray_serve_corpus, SERVE_ROWS, address, (0.25, 0.25), no_cache) as (url, _),
    ):
        yield url
