"""Ray for one run (``ray_session``), and nothing of that Ray left running once the driver is gone.

``ray_session(address)`` starts a local Ray unless one is already running in the process, yields a list the caller
appends its worker groups to, and on the way out (also on failure) shuts the groups down and stops the Ray it
started.

Why a guard process: a driver killed with SIGKILL (or by the OOM killer) runs no ``finally``. gcs_server and the
raylet die with it (Ray starts them with a parent-death signal), but the raylet's agents, ``ray::DashboardAgent``
and ``ray::RuntimeEnvAgent``, outlive it: their logs say the raylet died, yet they keep running (Ray 2.60; the
dashboard agent's last log line is its report of the death to the GCS, which is gone too). Both were still running
15 s after each of 4 driver kills. So before ``ray.init`` the session starts a small guard (``python -m
search_rl.ray_session``, in its own session so a Ctrl-C aimed at the driver does not reach it) and sends it the PIDs
of the processes ``ray.init`` started. The guard records the process tree under them every ``POLL_S`` seconds; when
its stdin pipe closes, which happens however the driver ends, it kills every recorded process still running (psutil
refuses a PID that was reused by another process) and exits. A cluster joined through ``address`` is not the run's
to kill: no guard then.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import psutil

logger = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the guard records the process tree of the run's Ray processes."""

RUNTIME_ENV = {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}}
"""Environment of every Ray worker: offline hub, no tokenizer thread pools."""


class RayGuard:
    """The driver's handle on the guard process: ``watch(pids)`` hands it PIDs; ``close()`` (or the driver's death)
    makes it kill what is left of them and exit."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "search_rl.ray_session"],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        self._pipe: IO[bytes] = self.process.stdin

    def watch(self, pids: list[int]) -> None:
        self._pipe.write(b"".join(f"{pid}\n".encode() for pid in pids))
        self._pipe.flush()

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the pipe and wait for the guard to finish its cleanup."""
        self._pipe.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("the Ray guard (pid %d) did not exit within %.0f s", self.process.pid, timeout_s)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


@contextmanager
def ray_session(address: str | None) -> Iterator[list[Any]]:
    """Ray for one run: started here unless already running (then stopped here, and guarded, see the module
    docstring); the worker groups the block appends to the yielded list are shut down on the way out, also on
    failure."""
    import ray

    started, guard = False, None
    if not ray.is_initialized():
        if address is None:
            guard = RayGuard()
            before = _children()
        try:
            ray.init(address=address, include_dashboard=False, runtime_env=RUNTIME_ENV)
        except BaseException:
            if guard is not None:
                guard.close()
            raise
        started = True
        if guard is not None:
            guard.watch(sorted(_children() - before - {guard.process.pid}))
    groups: list[Any] = []
    try:
        yield groups
    finally:
        try:
            for group in groups:
                if group is not None:
                    group.shutdown()
        finally:
            if started:
                ray.shutdown()
            if guard is not None:
                guard.close()


def _record(roots: list[psutil.Process], seen: dict[int, psutil.Process]) -> None:
    for root in roots:
        try:
            if root.is_running():
                seen.setdefault(root.pid, root)
                for child in root.children(recursive=True):
                    seen.setdefault(child.pid, child)
        except psutil.Error:
            continue


def _kill(seen: dict[int, psutil.Process]) -> None:
    for proc in seen.values():
        try:
            if proc.is_running():  # False when the PID now belongs to another process
                proc.kill()
        except psutil.Error:
            continue


def run_guard(fd: int = 0) -> None:
    """The guard's loop (see the module docstring): read PIDs from ``fd`` until it closes, then kill them all."""
    roots: list[psutil.Process] = []
    seen: dict[int, psutil.Process] = {}
    pending = b""
    while True:
        if select.select([fd], [], [], POLL_S)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    roots.append(psutil.Process(int(line)))
                except (ValueError, psutil.Error):
                    continue
        _record(roots, seen)
    _record(roots, seen)
    _kill(seen)


if __name__ == "__main__":
    run_guard()
