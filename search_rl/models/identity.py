"""What identifies a model's weights, wherever they come from: a sha256 over a loaded model's tensors, or over the
weight files of a model source (``load_model``'s sources), so the same weights at another path hash alike."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

from search_rl.models.loading import load_model, model_dir

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
"""Patterns of a model folder's weight files, in order of preference (the first that matches is hashed)."""


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a model's parameters and buffers, in name order.

    >>> import torch
    >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> b.load_state_dict(a.state_dict())
    <All keys matched successfully>
    >>> weights_sha256(a) == weights_sha256(b)
    True
    """
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def folder_weights_sha256(folder: Path) -> str:
    """sha256 over the names and bytes of a model folder's weight files (``WEIGHT_FILES``).

    Raises:
        FileNotFoundError: the folder holds no weight file.
    """
    for pattern in WEIGHT_FILES:
        files = sorted(folder.glob(pattern))
        if files:
            stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
            return _files_sha256(folder.resolve(), stats)
    raise FileNotFoundError(f"{folder}: no weight file ({', '.join(WEIGHT_FILES)}) to identify the model by")


@functools.lru_cache(maxsize=16)
def _files_sha256(folder: Path, stats: tuple[tuple[str, int, int], ...]) -> str:
    """Cached by name, size and modification time: a rewritten file is hashed again."""
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(f"{name}\n".encode())
        with (folder / name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=16)
def _tiny_sha256(seed: int) -> str:
    return weights_sha256(load_model("tiny", seed=seed))


def source_weights_sha256(source: str, seed: int = 0) -> str:
    """sha256 of the weights ``source`` names: the ``tiny`` model's tensors (built from ``seed``), else the weight
    files of its folder (``model_dir``: a GGUF source is converted once).

    Raises:
        FileNotFoundError: no such model, or a folder without weight files.
    """
    if source == "tiny":
        return _tiny_sha256(seed)
    return folder_weights_sha256(model_dir(source))
