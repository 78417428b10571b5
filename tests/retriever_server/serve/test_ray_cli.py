"""Ray's CLI for the running interpreter (``ray_cli``): the interpreter's own ``ray`` script when its scripts folder
has one; otherwise (a venv made with ``--system-site-packages`` over a Python that has Ray gets no script) Ray's
console entry point run by this interpreter, which really runs Ray's CLI, and never another Python's ``ray`` on
PATH.

Run: python -m pytest tests/retriever_server/serve/test_ray_cli.py -q
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retriever_server.serve import ray_cli as ray_cli_module
from retriever_server.serve.ray_cli import SCRIPT_NAME, ray_cli


def _script(folder: Path, body: str, executable: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SCRIPT_NAME
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755 if executable else 0o644)
    return path


def test_the_interpreters_own_script_comes_first(tmp_path):
    own = _script(tmp_path / "bin", "exit 0")
    assert ray_cli(own.parent) == [str(own)]


def test_without_a_script_the_entry_point_runs_under_this_interpreter(tmp_path, monkeypatch):
    """The system-site-packages case: no script beside the interpreter, and PATH holds another Python's ``ray``
    (a stand-in that fails loudly) which must not be used."""
    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
    _script(scripts, "exit 0", executable=False)  # a leftover that cannot run is no script
    other = _script(tmp_path / "other-python-bin", "echo 'another Python' >&2; exit 3")
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{os.environ['PATH']}")
    cmd = ray_cli(scripts)
    assert cmd[0] == sys.executable and str(other) not in " ".join(cmd)
    done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    version = importlib.metadata.version("ray")
    assert done.stdout.strip() == f"ray, version {version}", done.stdout  # Ray's CLI, named ray in its output


def test_without_ray_the_error_says_where_it_looked(tmp_path, monkeypatch):
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ray_cli_module.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=rf"no {SCRIPT_NAME} script in {tmp_path}.*install search-rl"):
        ray_cli(tmp_path)
