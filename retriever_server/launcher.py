"""Start a real retriever server (``python -m retriever_server``) in a child process and wait until it is ready.

Used by the demo, the tests and the trainer's one-command run, so every one of them talks to the real service::

    with RetrieverProcess(env={"RETRIEVER_METHOD": "bm25"}) as server:
        httpx.post(f"{server.url}/retrieve", json={"queries": ["..."]})
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_until_ready(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> dict:
    """Poll ``GET {url}/health`` until it answers 200; return its body.

    Raises:
        RuntimeError: the index failed to load, or the process exited.
        TimeoutError: not ready within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"retriever process exited with code {process.returncode} before it was ready")
        try:
            r = httpx.get(f"{url}/health", timeout=5)
            body = r.json()
            if r.status_code == 200:
                return dict(body)
            if body.get("status") == "failed":
                raise RuntimeError(f"retriever at {url} failed to load its index: {body.get('error')}")
            last = str(body.get("status"))
        except httpx.TransportError as e:
            last = type(e).__name__
        time.sleep(0.5)
    raise TimeoutError(f"retriever at {url} not ready after {timeout_s:.0f}s (last status: {last})")


def bm25_env(index_dir: Path, corpus: Path | None = None) -> dict[str, str]:
    """Settings of a throwaway BM25 server: its index built in ``index_dir`` (seconds for the shipped corpus, nothing
    shared with the user's cache), over ``corpus`` (default: the shipped one), progress bars off. Benchmarks and tests
    start one with ``RetrieverProcess(env=bm25_env(folder))``; add other ``RETRIEVER_*`` keys to the dict."""
    env = {"RETRIEVER_METHOD": "bm25", "RETRIEVER_INDEX_DIR": str(index_dir), "RETRIEVER_SHOW_PROGRESS": "false"}
    if corpus is not None:
        env["RETRIEVER_CORPUS_PATH"] = str(corpus)
    return env


class RetrieverProcess:
    """A ``python -m retriever_server`` child process; stopped on exit (also on errors and Ctrl-C)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout_s: float = 900.0,
        log_path: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.env = {**os.environ, **(env or {})}
        self.ready_timeout_s = ready_timeout_s
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> dict:
        """Start the server and block until ready; returns the /health body."""
        cmd = [sys.executable, "-m", "retriever_server", "--host", self.host, "--port", str(self.port)]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT if self._log else None
        )
        try:
            return wait_until_ready(self.url, self.ready_timeout_s, self.process)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{e}{self._log_tail()}") from e
        except BaseException:
            self.stop()
            raise

    def _log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log, for an error message ('' without a log)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; last lines of {self.log_path}:\n" + "\n".join(tail)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful uvicorn shutdown), then SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RetrieverProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
