"""Nothing of a run's Ray survives its driver (issue 16, item 9).

A driver process enters ``ray_session`` (as ``main_ppo.train`` does), starts an actor, lists every process below it
(gcs_server, raylet, ``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``, workers, the guard) and then either is
killed with SIGKILL or leaves the session normally. Before the guard, the two agents outlived a SIGKILLed driver in
4 of 4 tries.

Run: python -m pytest tests/search_rl/test_ray_session.py -q   (about 30 s)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import psutil, ray
    from search_rl.ray_session import ray_session

    @ray.remote(num_cpus=0.1)
    class Echo:
        def pid(self):
            return os.getpid()

    with ray_session(None):
        actor = Echo.remote()
        ray.get(actor.pid.remote())
        time.sleep(1.0)  # let the guard record the process tree (it polls every 0.5 s)
        procs = psutil.Process().children(recursive=True)
        print(json.dumps([[p.pid, p.create_time(), p.name()] for p in procs]), flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _run_driver(how: str) -> tuple[subprocess.CompletedProcess[str], list[tuple[int, float, str]]]:
    proc = subprocess.run([sys.executable, "-c", DRIVER, how], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert lines, proc.stderr[-2000:]
    return proc, [tuple(x) for x in json.loads(lines[-1])]


def _survivors(procs: list[tuple[int, float, str]], wait_s: float) -> list[str]:
    """Names of the listed processes still running after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid, created, name in procs:
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{name} ({pid})")
            except psutil.Error:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _kill(procs: list[tuple[int, float, str]]) -> None:
    """Clean up after a failed test: the processes this test's driver started, by PID."""
    for pid, created, _ in procs:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()
        except psutil.Error:
            continue


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_nothing_of_the_run_survives_its_driver(how):
    proc, procs = _run_driver(how)
    try:
        names = {name for _, _, name in procs}
        assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::Echo"} <= names
        assert proc.returncode == (-signal.SIGKILL if how == "kill" else 0), proc.stderr[-2000:]
        assert _survivors(procs, wait_s=15.0) == []
    finally:
        _kill(procs)
