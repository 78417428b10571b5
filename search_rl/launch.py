"""What the training entry points share (``main_ppo``, ``main_sft``; neither imports the other).

The setup errors ``prepare`` reports, the device, the worker specs and groups, the metric sinks, the workers' session
(Ray or this process, ``worker_session``), and the body of ``main``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from search_rl.config import ConfigError, TrainerConfig
from search_rl.configure import to_config
from search_rl.ray_session import ray_session
from search_rl.rollout.backends import RetrieverError
from search_rl.rollout.backends.web import SearchBudgetExhausted
from search_rl.tracking import Tracker, build_tracker
from search_rl.trainer.collect import RetrieverOutage
from search_rl.trainer.loop import History
from search_rl.workers import LocalWorkerGroup, WorkerGroup, Workers, WorkerSpec
from search_rl.workers.group import W

PREPARE_ERRORS = (ConfigError, ValueError, RetrieverError, FileNotFoundError, ImportError)
"""What ``prepare`` may raise about the user's setup; reported as one line and exit code 2."""


P = TypeVar("P")
G = TypeVar("G")


def resolve_device(requested: str, use_ray: bool = True) -> str:
    """``auto`` → ``cuda`` when the Ray cluster (or, without Ray, this process) sees a GPU, else ``cpu``."""
    if requested != "auto":
        return requested
    if not use_ray:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    import ray

    return "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"


def worker_specs(t: TrainerConfig, device: str, n_groups: int = 1) -> list[WorkerSpec]:
    """One spec per data-parallel rank. Every worker process gets its share of the cores (``n_groups`` groups share
    the machine): oversubscribed OpenMP threads spin and can slow torch 50x."""
    threads = t.torch_threads_per_worker or max(1, (os.cpu_count() or 1) // (t.n_workers * n_groups))
    return [
        WorkerSpec(rank=r, world_size=t.n_workers, device=device, torch_threads=threads, seed=t.seed)
        for r in range(t.n_workers)
    ]


def make_group(
    worker_cls: type[W], name: str, specs: list[WorkerSpec], t: TrainerConfig, local: bool, **init_kwargs: Any
) -> Workers[W]:
    """A group of ``worker_cls``, not started yet: one Ray actor per spec, or with ``local`` one in this process."""
    if local:
        return LocalWorkerGroup(worker_cls, specs[0], **init_kwargs)
    return WorkerGroup(
        worker_cls,
        specs,
        name=name,
        num_cpus=t.cpus_per_worker,
        num_gpus=1.0 if specs[0].device == "cuda" else 0.0,
        timeout_s=t.worker_timeout_s,
        **init_kwargs,
    )


def build_run_tracker(t: TrainerConfig, config_dict: dict[str, Any] | None) -> Tracker:
    """The metric sinks of ``trainer.logger`` for the run folder, with the composed config as the run's config."""
    return build_tracker(
        t.logger,
        Path(t.default_local_dir),
        t.total_training_steps,
        t.project_name,
        t.experiment_name,
        config_dict or {},
    )


@dataclass
class WorkerSession:
    """Where a run's workers live: the device, whether they are in-process (``trainer.use_ray=false``), and the
    groups started so far (shut down when the session ends)."""

    device: str
    local: bool
    groups: list[Any] = field(default_factory=list)

    def started(self, group: G) -> G:
        """Register ``group`` (a worker group or rollout source) for shutdown; returns it."""
        if not self.local:
            self.groups.append(group)
        return group


@contextmanager
def worker_session(t: TrainerConfig, tracker: Tracker) -> Iterator[WorkerSession]:
    """The run's workers' home: Ray (``ray_session``: started unless already running) or, with
    ``trainer.use_ray=false``, this process. Groups registered with ``session.started`` are shut down on the way out,
    and the tracker is closed, also on failure."""
    try:
        if not t.use_ray:
            yield WorkerSession(resolve_device(t.device, use_ray=False), local=True)
            return
        with ray_session(t.ray_address) as groups:
            session = WorkerSession(resolve_device(t.device), local=False, groups=groups)
            yield session
    finally:
        tracker.close()


def run_main(
    composed: DictConfig,
    prepare: Callable[[Any, dict[str, Any]], P],
    train: Callable[[Any, P], History],
    what: str,
    logger: logging.Logger,
) -> None:
    """The body of an entry point's ``main``: the typed config, ``prepare`` (a setup error exits with code 2 and one
    line saying that ``what`` cannot start), then ``train`` (a retriever outage, ``RetrieverOutage``, or a spent web
    search budget, ``SearchBudgetExhausted``, exits with code 3 and one line; the last checkpoint is kept for a
    resume)."""
    try:
        cfg = to_config(composed)
        prepared = prepare(cfg, OmegaConf.to_container(composed, resolve=True))  # type: ignore[arg-type]
    except PREPARE_ERRORS as e:
        logger.error("cannot start %s: %s", what, e)
        sys.exit(2)
    try:
        history = train(cfg, prepared)
    except (RetrieverOutage, SearchBudgetExhausted) as e:  # the message says what to check; a traceback would not
        logger.error("stopped %s: %s", what, e)
        sys.exit(3)
    logger.info("done: %d steps logged; checkpoints and metrics in %s", len(history), cfg.trainer.default_local_dir)
