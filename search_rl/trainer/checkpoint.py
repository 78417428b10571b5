"""Checkpoint folders: written atomically, the last ``k`` kept, the latest found for ``trainer.resume=auto``.

Layout of ``<trainer.default_local_dir>/global_step_<N>/``::

    actor/              HF model folder (config, safetensors, tokenizer): main_eval and main_ppo load it as a model
    actor_optim.pt      AdamW and schedule state of the policy
    critic/             model.safetensors of the value model (when there is a critic)
    critic_optim.pt     its optimizer state
    trainer_state.pt    step, data-loader position, KL controller, RNG states

A checkpoint is written into a hidden ``.tmp-global_step_<N>-<pid>`` folder and renamed into place only once every
file is there: a rename is atomic, so a crash mid-write leaves the previous checkpoints usable and at most a stray
temporary folder (ignored, and removed by the next save). The trainer writes the step's ``metrics.jsonl`` line inside
the ``writing`` block, so it is on disk before the rename. ``latest_checkpointed_iteration.txt`` (verl's name) is
rewritten after each save for tools; resuming does not trust it and scans the folders instead. With several
machines, ``default_local_dir`` must be on a file system every worker can write (workers write their own files).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.pt"


def step_dir_name(step: int) -> str:
    return f"global_step_{step}"


class CheckpointManager:
    """Checkpoints of one run folder.

    Args:
        root: the run folder (``trainer.default_local_dir``).
        keep: most recent checkpoints to keep (0 = all).
    """

    def __init__(self, root: Path, keep: int) -> None:
        self.root, self.keep = root, keep

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
        return sorted(found)

    def latest(self) -> Path | None:
        """The most recent complete checkpoint, or None."""
        steps = self.steps()
        return self.root / step_dir_name(steps[-1]) if steps else None

    def resolve(self, resume: str) -> Path | None:
        """The checkpoint ``trainer.resume`` asks for: ``auto`` → latest (or None), ``disable`` → None, else a path.

        Raises:
            FileNotFoundError: an explicit path that is not a checkpoint folder.
        """
        if resume == "disable":
            return None
        if resume == "auto":
            return self.latest()
        path = Path(resume)
        if not (path / TRAINER_STATE).is_file():
            raise FileNotFoundError(f"trainer.resume={resume}: no {TRAINER_STATE} in that folder; not a checkpoint")
        return path

    @contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """Yield an empty temporary folder; when the block succeeds, commit it as ``global_step_<step>``."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stray in self.root.glob(".tmp-global_step_*"):
            shutil.rmtree(stray, ignore_errors=True)
        tmp = self.root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._commit(tmp, step)

    def _commit(self, tmp: Path, step: int) -> None:
        target = self.root / step_dir_name(step)
        if target.exists():  # a re-run of this step (resume=disable over an old run): move the old one aside first
            old = self.root / f".tmp-old-{step_dir_name(step)}-{os.getpid()}"
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
        latest = self.root / f".{LATEST_FILE}.tmp"
        latest.write_text(f"{step}\n")
        latest.replace(self.root / LATEST_FILE)
        logger.info("saved checkpoint %s", target)
        self._prune()

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        for step in self.steps()[: -self.keep]:
            shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)
            logger.info("removed old checkpoint %s", step_dir_name(step))
