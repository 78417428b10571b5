"""Where metrics and trajectories go: console, JSONL, TensorBoard and wandb sinks, and per-step rollout dumps."""

from search_rl.tracking.rollout_dump import RolloutDumper, trajectory_record
from search_rl.tracking.tracker import Tracker, build_tracker, timer

__all__ = ["RolloutDumper", "Tracker", "build_tracker", "timer", "trajectory_record"]
