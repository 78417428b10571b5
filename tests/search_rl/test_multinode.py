"""Two Ray nodes on this machine, as a multi-node run starts them: ``ray start --head`` and ``ray start --address``,
one CPU each, then ``main_ppo`` with ``trainer.ray_address`` and two workers of one CPU, so one lands on each node.
A GRPO step completes, and the workers met at rank 0's node address.

Run: python -m pytest tests/search_rl/test_multinode.py -q   (about a minute)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retriever_server.serve.ray_cli import ray_cli

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration]

# Token authentication (on by default in Ray 2.60) is a cluster-wide choice; these loopback-only nodes opt out.
# RAY_DEDUP_LOGS=0: the driver otherwise folds worker lines that differ only in numbers ("rank 1/2 ... joined" into
# "rank 0/2 ... [repeated 3x across cluster]"), and the test reads each rank's line
RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(process: subprocess.Popen, marker: str) -> None:
    """SIGTERM the node's process group, then SIGKILL whatever of it (or of its temp dir) is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=45)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    subprocess.run(["pkill", "-9", "-f", marker], check=False)


@contextlib.contextmanager
def two_nodes(tmp: Path) -> Iterator[str]:
    """A head node and a second node, one CPU each; yields the cluster's address."""
    port = _free_port()
    temp_dir = f"/tmp/ray-2node-{port}"  # short: Ray's socket paths must fit in 107 bytes
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    ray = ray_cli()  # this interpreter's Ray, whatever PATH holds (an unactivated or system-site-packages venv)
    head = subprocess.Popen(
        [*ray, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}", *common],
        env=RAY_ENV,
        stdout=(tmp / "head.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        _wait_for_nodes(address, 1, timeout_s=90)
        nodes.append(
            subprocess.Popen(
                [*ray, "start", f"--address={address}", *common],
                env=RAY_ENV,
                stdout=(tmp / "node.log").open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_for_nodes(address, 2, timeout_s=90)
        yield address
    finally:
        for process in reversed(nodes):
            _stop(process, temp_dir)


def _wait_for_nodes(address: str, n: int, timeout_s: float) -> None:
    code = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
        "print(sum(1 for x in ray.nodes() if x['Alive']))"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", code, address], env=RAY_ENV, capture_output=True, text=True, timeout=60
        )
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(n)]:
            return
        time.sleep(1)
    raise TimeoutError(f"the Ray cluster at {address} did not reach {n} nodes in {timeout_s:.0f} s")


def test_a_training_step_spans_two_ray_nodes(retriever_url, tmp_path):
    run_dir = tmp_path / "run"
    with two_nodes(tmp_path) as address:
        cmd = [
            sys.executable,
            "-m",
            "search_rl.main_ppo",
            "algorithm=grpo",
            "model=tiny",
            f"retriever.url={retriever_url}",
            f"trainer.ray_address={address}",
            "trainer.n_workers=2",
            "trainer.cpus_per_worker=1",  # one CPU per node: the two workers cannot share a node
            "trainer.torch_threads_per_worker=1",
            "trainer.total_training_steps=1",
            "trainer.save_freq=0",
            "trainer.test_freq=0",
            "trainer.logger=[jsonl]",
            "trainer.worker_timeout_s=300",
            f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "max_turns=1",
            "actor_rollout_ref.rollout.max_turn_tokens=16",
            "actor_rollout_ref.rollout.max_response_tokens=64",
        ]
        done = subprocess.run(cmd, env=RAY_ENV, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["perf/actor_update_tokens"] > 0
    # "rank r/2 on node <id> joined the gloo group at <host>:<port>", from each worker (Ray forwards their logs)
    joins = re.findall(r"rank (\d)/2 on node (\w+) joined the gloo group at ([\d.]+):(\d+)", log)
    by_rank = {int(rank): (node, host, port) for rank, node, host, port in joins}
    assert sorted(by_rank) == [0, 1], log[-4000:]
    assert by_rank[0][0] != by_rank[1][0], "both workers ran on one node"
    assert by_rank[0][1:] == by_rank[1][1:]  # one rendezvous
    ready = re.search(r"actor: 2 workers ready \(rendezvous ([\d.]+):(\d+)\)", log)
    assert ready and ready.groups() == by_rank[0][1:]
    assert not by_rank[0][1].startswith("127."), "the rendezvous must use the node's address, not loopback"
