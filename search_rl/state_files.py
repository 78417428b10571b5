"""Checkpoint state files (``trainer_state.pt``, ``*_optim.pt``): read with ``torch.load(weights_only=True)``.

A pickle can run any code while it loads, and checkpoints travel (shared folders, downloads). So the trainer writes
only tensors and plain containers (dicts, lists, tuples, ints, floats, str, bool, None) and reads nothing else: the
numpy RNG state, an array, is stored as a list (``numpy_rng_state``).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def load_state(path: Path) -> dict[str, Any]:
    """The dict a checkpoint state file holds, on CPU.

    Raises:
        ValueError: the file holds something besides tensors and plain containers (a pickled object), named with
            the file and the object's type; or it is not a dict.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = _GLOBAL.search(str(e))
        what = found.group(1) if found else str(e).splitlines()[0]
        raise ValueError(
            f"{path}: refused to load: it holds a pickled {what}, and a checkpoint may hold only tensors, dicts, "
            "lists, numbers and strings (loading other objects can run code). If this is your own checkpoint from an "
            "older search-rl, resume it with that version, or start a new run from its weights "
            "(model.path=<checkpoint>/actor)"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: a checkpoint state file holds a dict, this one a {type(state).__name__}")
    return state


def numpy_rng_state() -> dict[str, Any]:
    """numpy's global RNG state in plain types (``np.random.get_state()`` holds an array)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "name": str(name),
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def set_numpy_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``numpy_rng_state`` returned.

    >>> saved = numpy_rng_state(); a = np.random.rand(); set_numpy_rng_state(saved); bool(np.random.rand() == a)
    True
    """
    keys = np.asarray(state["keys"], dtype=np.uint32)
    np.random.set_state((state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]))
