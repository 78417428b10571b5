"""A released vLLM's weight-transfer base module (``vllm/distributed/weight_transfer/base.py``), loaded on its own.

The weight-sync code supports vLLM releases that are not installed beside the CPU build (0.33 ships only as a GPU
wheel, with its own torch). Their ``WeightSource`` contract lives in one file whose only vLLM imports are two config
classes it uses as type annotations, so the tests take that file from the release's wheel (``pip download``, once;
kept under ``$XDG_CACHE_HOME/search-rl/vllm-sources/``) and import it with stand-ins for those two names.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BASE = "vllm/distributed/weight_transfer/base.py"
ANNOTATION_ONLY = {"vllm.config.parallel": "ParallelConfig", "vllm.config.weight_transfer": "WeightTransferConfig"}
"""The vLLM modules ``base.py`` imports, and the one class of each it names (in annotations only)."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "search-rl" / "vllm-sources"


def release_file(version: str, member: str = BASE) -> Path:
    """``member`` of the vLLM ``version`` wheel, downloaded with pip the first time (the GPU wheel is ~340 MB; only
    the member is kept)."""
    target = cache_dir() / version / member
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as folder:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", folder]
        subprocess.run([*pip, f"vllm=={version}"], check=True, timeout=1200)
        (wheel,) = Path(folder).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


@contextmanager
def _annotation_stand_ins() -> Iterator[None]:
    """The two annotation-only imports as empty classes, for the import's duration (an installed vLLM's own modules,
    if any, are put back afterwards)."""
    saved = {name: sys.modules.get(name) for name in ANNOTATION_ONLY}
    for name, cls in ANNOTATION_ONLY.items():
        module = types.ModuleType(name)
        setattr(module, cls, type(cls, (), {}))
        sys.modules[name] = module
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def weight_transfer_base(version: str) -> types.ModuleType:
    """The release's ``base.py`` as a module named ``vllm_<version>_weight_transfer_base``."""
    name = f"vllm_{version.replace('.', '_')}_weight_transfer_base"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, release_file(version))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with _annotation_stand_ins():
        spec.loader.exec_module(module)
    return module
