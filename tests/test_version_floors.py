"""The version floors in pyproject.toml are the versions CI runs: the vLLM job's venv (``make install-vllm``) holds
the lowest transformers and torch the project declares, so its passing tests prove the floors. Skipped without vLLM.

Run: .venv-vllm/bin/python -m pytest tests/test_version_floors.py -q   (after make install-vllm)
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _floor(package: str) -> str:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(rf"{package}\b", d))
    found = re.search(r">=\s*([\w.]+)", spec)
    assert found, f"{package} has no floor in pyproject.toml: {spec}"
    return found.group(1)


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:2])


@pytest.mark.parametrize("package", ["transformers", "torch"])
def test_the_vllm_venv_runs_the_declared_floor(package):
    installed, floor = version(package), _floor(package)
    assert _release(installed) == _release(floor), (
        f"the vLLM job runs {package} {installed} but pyproject.toml declares >={floor}: set the floor to the "
        "version this job proves"
    )
