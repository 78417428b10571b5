"""Checkpoint folders: atomic commit, a crash mid-write leaves the previous checkpoint usable, keep the last k; state
files hold plain data only, and one holding a pickled object is refused.

Run: python -m pytest tests/search_rl/trainer/test_checkpoint.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from search_rl.state_files import load_state, numpy_rng_state, set_numpy_rng_state
from search_rl.trainer.checkpoint import LATEST_FILE, TRAINER_STATE, CheckpointManager


def _save(manager: CheckpointManager, step: int) -> None:
    with manager.writing(step) as tmp:
        (tmp / TRAINER_STATE).write_text(str(step))


def test_commit_latest_and_keep_last_k(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.latest() is None and manager.resolve("auto") is None
    for step in (2, 4, 6):
        _save(manager, step)
    assert manager.steps() == [4, 6]
    assert manager.latest() == tmp_path / "global_step_6"
    assert (tmp_path / LATEST_FILE).read_text().strip() == "6"
    assert manager.resolve("disable") is None
    assert manager.resolve(str(tmp_path / "global_step_4")) == tmp_path / "global_step_4"
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        manager.resolve(str(tmp_path))


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, keep=0)
    _save(manager, 2)
    with pytest.raises(RuntimeError, match="killed"), manager.writing(4) as tmp:
        (tmp / "actor_optim.pt").write_text("half")
        raise RuntimeError("killed")
    assert manager.steps() == [2]
    # a hard kill leaves the temporary folder behind: it is never taken for a checkpoint, and the next save removes it
    stray = tmp_path / ".tmp-global_step_4-999"
    (stray / "actor").mkdir(parents=True)
    assert manager.latest() == tmp_path / "global_step_2"
    _save(manager, 4)
    assert not stray.exists() and manager.steps() == [2, 4]


def test_saving_a_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path, keep=0)
    _save(manager, 2)
    with manager.writing(2) as tmp:
        (tmp / TRAINER_STATE).write_text("again")
    assert (tmp_path / "global_step_2" / TRAINER_STATE).read_text() == "again"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


class Payload:
    """Any pickled object: loading it could run code."""


def test_state_files_hold_plain_data_and_a_pickled_object_is_refused(tmp_path):
    state = {"step": 3, "rng": {"numpy": numpy_rng_state(), "torch": torch.get_rng_state()}, "health": {"a": [0.5]}}
    torch.save(state, tmp_path / TRAINER_STATE)
    loaded = load_state(tmp_path / TRAINER_STATE)
    assert loaded["step"] == 3 and loaded["rng"]["numpy"] == state["rng"]["numpy"]
    set_numpy_rng_state(loaded["rng"]["numpy"])
    evil = tmp_path / "global_step_4" / "actor_optim.pt"
    evil.parent.mkdir()
    torch.save({"optimizer": {}, "scheduler": Payload()}, evil)
    with pytest.raises(ValueError, match=rf"{evil}: refused to load: it holds a pickled .*Payload"):
        load_state(evil)
    torch.save({"rng": np.random.get_state()}, evil)  # what older checkpoints held
    with pytest.raises(ValueError, match=r"actor_optim.pt: refused to load: it holds a pickled numpy"):
        load_state(evil)
