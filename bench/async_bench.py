"""Throughput of ``trainer.mode`` sync / one_step_off / async: measured here, and projected by simulation.

**Measured** (``measure``): GRPO steps of a small model (the tiny random Llama by default) through the real path
(``main_ppo.run``: Ray, the actor worker, generator actors, the bounded queue, a real BM25 retriever started by the
script), one torch thread for the trainer's worker and one for the generator. On this 2-core machine both sides share
the same two cores with the driver and the retriever, so the overlap buys at most what the cores leave idle. Reported
per mode: mean seconds per step over steps 2..N, the rollout wait of the trainer, and the idle fractions.

**Projected** (``simulate``): a discrete-event simulation of the coordinator's own scheduling rules (a unit is
dispatched when the queue has room for it and its weights would be at most ``max_staleness`` versions old at the
step that takes it; stale groups are dropped) with one trainer and ``G`` generators on separate devices. Inputs are
phase times: by default the GRPO 4 x 4 step of the learning benchmark (docs/experiments/) (rollout 20.5 s; old
log-probs 18.0 + reference log-probs 15.9 + actor update 53.9 = 87.8 s of learning), or
``--phases-from <run>/metrics.jsonl``. Rollout times of a unit follow the long tail of search agents: a batch
generates turn by turn until its slowest sample is done, so
its time is proportional to the most turns any of its samples takes; each sample takes 1, 2, 3 or 4 (the budget)
turns with probabilities 0.70 / 0.15 / 0.10 / 0.05 (assumed: most answer after one search, a few search three
times and run to the budget), scaled so the mean unit time is the measured rollout time.

    python bench/async_bench.py                       # measure (about 5 minutes) and simulate
    python bench/async_bench.py --simulate-only       # the projection alone (a second)
    python bench/async_bench.py --retriever-url http://127.0.0.1:8000/retrieve --steps 6

Last line: ``async_bench sync_s=<s> one_step_off_s=<s> async_s=<s>`` (measured mean seconds per step).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

TURN_PROBS = ((1, 0.70), (2, 0.15), (3, 0.10), (4, 0.05))
"""Turns per sample of the long tail (assumed; see the module docstring)."""

LEARNING_MD_GRPO = {"rollout": 20.5, "old_log_prob": 18.0, "ref_log_prob": 15.9, "update_actor": 53.9}
"""Phase seconds of GRPO 4 prompts x 4 from the warm start, 2-core CPU
(docs/experiments/2026-11-21-learning-benchmark.md)."""

MODES = {
    "sync": ("trainer.mode=sync",),
    "one_step_off": ("trainer.mode=one_step_off",),
    "async": ("trainer.mode=async", "trainer.max_staleness=1", "trainer.max_queue_batches=2"),
}


# --- simulation ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """One mode as the coordinator runs it."""

    name: str
    generators: int
    max_staleness: int
    capacity_batches: int
    lockstep: bool = False
    reuse_old: bool = False
    """Old log-probs from the rollout (on-policy batches only): learning skips the old log-prob pass."""


SCHEDULES = (
    Schedule("sync", 0, 0, 1, lockstep=True),
    Schedule("sync, old log-probs from the rollout", 0, 0, 1, lockstep=True, reuse_old=True),
    Schedule("one_step_off", 1, 1, 1),
    Schedule("async s=1 q=2, 1 gen", 1, 1, 2),
    Schedule("async s=2 q=3, 1 gen", 1, 2, 3),
    Schedule("async s=1 q=2, 2 gen", 2, 1, 2),
)


def unit_times(n: int, samples: int, mean_s: float, tail: bool, rng: random.Random) -> list[float]:
    """``n`` rollout times of a unit of ``samples`` samples: constant, or the long tail scaled to ``mean_s``."""
    if not tail:
        return [mean_s] * n
    turns, weights = zip(*TURN_PROBS, strict=True)
    raw = [max(rng.choices(turns, weights, k=samples)) for _ in range(n)]
    scale = mean_s / statistics.fmean(raw)
    return [r * scale for r in raw]


def simulate(sched: Schedule, rollout: list[float], learn_s: float, steps: int) -> dict[str, float]:
    """Event-driven run of ``steps`` steps: seconds per step in the steady state (the second half), mean staleness,
    units dropped as too stale, and the idle fractions of the generators and the trainer."""
    draws = iter(rollout)
    if sched.lockstep:
        times = [next(draws) for _ in range(steps)]
        total = sum(times) + steps * learn_s
        half = steps // 2
        return {
            "step_s": (sum(times[half:]) + (steps - half) * learn_s) / (steps - half),
            "staleness": 0.0,
            "dropped": 0.0,
            "gen_idle": 1 - sum(times) / total,
            "trainer_idle": sum(times) / total,
        }
    free_at = [0.0] * sched.generators
    in_flight: list[tuple[float, int]] = []  # (finish time, weight version)
    ready: list[tuple[float, int]] = []
    now, published, taken, learning_until = 0.0, 0, 0, None
    busy, waiting_since, idle, dropped = 0.0, 0.0, 0.0, 0
    ends: list[float] = []
    stale: list[int] = []

    def dispatch() -> None:
        nonlocal busy
        for g in range(sched.generators):
            queued = len(ready) + len(in_flight)
            if free_at[g] > now or queued >= sched.capacity_batches:
                continue
            if published < taken + 1 + queued - 1 - sched.max_staleness:
                return
            d = next(draws)
            free_at[g], busy = now + d, busy + d
            in_flight.append((now + d, published))

    dispatch()
    while len(ends) < steps:
        if learning_until is None:  # the trainer waits: drop what is too old, take the oldest fresh unit
            fresh = [u for u in ready if published - u[1] <= sched.max_staleness]
            dropped += len(ready) - len(fresh)
            ready[:] = sorted(fresh, key=lambda u: (u[1], u[0]))
            if ready:
                unit = ready.pop(0)
                stale.append(published - unit[1])
                idle += now - waiting_since
                taken += 1
                learning_until = now + learn_s
                dispatch()
                continue
        events = [u[0] for u in in_flight] + ([learning_until] if learning_until is not None else [])
        now = min(events)
        for u in [u for u in in_flight if u[0] <= now]:
            in_flight.remove(u)
            ready.append(u)
        if learning_until is not None and learning_until <= now:
            published, learning_until, waiting_since = taken, None, now
            ends.append(now)
        dispatch()
    half = steps // 2
    return {
        "step_s": (ends[-1] - ends[half - 1]) / (steps - half),
        "staleness": statistics.fmean(stale),
        "dropped": float(dropped),
        "gen_idle": 1 - busy / (ends[-1] * sched.generators),
        "trainer_idle": idle / ends[-1],
    }


def phases_from(path: Path) -> dict[str, float]:
    """Mean phase seconds of steps 2.. of a run's ``metrics.jsonl``."""
    from search_rl.tracking.jsonl import read_jsonl

    rows = read_jsonl(path)
    rows = [r for r in rows if r.get("step", 0) >= 2] or rows
    return {p: statistics.fmean(r.get(f"timing/{p}_s", 0.0) for r in rows) for p in LEARNING_MD_GRPO}


def project(phases: dict[str, float], samples: int, steps: int, seed: int) -> list[str]:
    """Markdown rows: each schedule, with the measured rollout time and with the long tail of the same mean, and
    with rollout as long as learning and twice as long (rollout-heavy recipes: longer budgets, more turns)."""
    learn = phases["old_log_prob"] + phases["ref_log_prob"] + phases["update_actor"]
    rows = []
    scenarios = (("measured", phases["rollout"]), ("rollout = learn", learn), ("rollout = 2 x learn", 2 * learn))
    for label, mean_rollout in scenarios:
        for tail in (False, True):
            rollout = unit_times(steps * 4, samples, mean_rollout, tail, random.Random(seed))
            base = None
            for sched in SCHEDULES:
                r = simulate(sched, rollout, learn - (phases["old_log_prob"] if sched.reuse_old else 0.0), steps)
                base = base or r["step_s"]
                rows.append(
                    f"| {label} ({mean_rollout:.1f} s{', long tail' if tail else ''}) / learn {learn:.1f} s | "
                    f"{sched.name} | {r['step_s']:.1f} | {base / r['step_s']:.2f}x | {r['staleness']:.2f} | "
                    f"{r['dropped']:.0f} | {max(r['gen_idle'], 0.0):.2f} | {max(r['trainer_idle'], 0.0):.2f} |"
                )
    return rows


# --- measurement -----------------------------------------------------------------------------------------------


def measure(mode: str, url: str, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """Run ``args.steps`` GRPO steps in ``mode``; mean seconds per step (steps 2..N) and the async metrics."""
    from search_rl.configure import load_config
    from search_rl.main_ppo import run

    overrides = [
        f"model={args.model}",
        "algorithm=grpo",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"retriever.url={url}",
        f"trainer.default_local_dir={out / mode}",
        "trainer.resume=disable",
        f"trainer.total_training_steps={args.steps}",
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        "trainer.logger=[jsonl]",
        "trainer.dump_rollouts=false",
        "trainer.n_workers=1",
        "trainer.torch_threads_per_worker=1",
        "trainer.cpus_per_worker=0.5",
        "max_turns=2",
        "actor_rollout_ref.rollout.max_turn_tokens=32",
        "actor_rollout_ref.rollout.max_obs_tokens=128",
        "actor_rollout_ref.rollout.max_response_tokens=256",
        *MODES[mode],
        *args.override,
    ]
    history = dict(run(load_config(overrides)))
    later = [history[s] for s in sorted(history) if s >= 2]
    keys = (
        "timing/step_s",
        "timing/rollout_s",
        "timing/old_log_prob_s",
        "timing/update_actor_s",
        "async/trainer_idle_frac",
        "async/generator_idle_frac",
    )
    return {k: statistics.fmean(m.get(k, float("nan")) for m in later) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--retriever-url", default=None, help="use this retriever instead of starting BM25")
    parser.add_argument("--simulate-only", action="store_true")
    parser.add_argument("--phases-from", type=Path, default=None, help="a run's metrics.jsonl (default: learning.md)")
    parser.add_argument("--sim-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    phases = phases_from(args.phases_from) if args.phases_from else LEARNING_MD_GRPO
    print("projection (one trainer and G generators on separate devices):")  # noqa: T201
    print(
        "| phases | schedule | s / step | speed-up | mean staleness | dropped units | generator idle | trainer idle |"
    )  # noqa: T201
    print("|---|---|---|---|---|---|---|---|")  # noqa: T201
    for row in project(phases, 16, args.sim_steps, args.seed):
        print(row)  # noqa: T201
    if args.simulate_only:
        return

    from search_rl.logging_setup import configure_logging

    configure_logging()
    import ray

    results = {}
    with contextlib.ExitStack() as stack:
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="async-bench-")))
        url = args.retriever_url
        if url is None:
            from retriever_server.launcher import RetrieverProcess, bm25_env

            server = RetrieverProcess(env=bm25_env(out / "index"), log_path=out / "retriever.log")
            url = stack.enter_context(server).url
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        stack.callback(ray.shutdown)
        for mode in MODES:
            results[mode] = measure(mode, url, out, args)
            r = results[mode]
            print(  # noqa: T201
                f"{mode}: step {r['timing/step_s']:.2f} s, rollout wait {r['timing/rollout_s']:.2f} s, old log-probs "
                f"{r['timing/old_log_prob_s']:.2f} s, actor update {r['timing/update_actor_s']:.2f} s, "
                f"trainer idle {r['async/trainer_idle_frac']:.2f}, generator idle {r['async/generator_idle_frac']:.2f}"
            )
    print(  # noqa: T201
        "async_bench " + " ".join(f"{m}_s={r['timing/step_s']:.2f}" for m, r in results.items())
    )


if __name__ == "__main__":
    main()
