"""What ``model.dtype=auto`` buys on this machine: the demo's warm start and GRPO steps in float32 and with ``auto``,
one after the other in the same run.

For each dtype (``float32``, then ``auto``): ``main_sft`` with the demo's warm-start settings (``--sft-steps`` steps
of 8 trajectories), then ``main_ppo`` with the demo's RL settings (GRPO, 4 prompts x 4 samples, LoRA r16, two
mini-batches, the kept questions) for ``--rl-steps`` steps. Both RL runs start from the float32 warm start, so they
train the same weights on the same prompts (seed 0); only the sampled tokens differ. Dynamic sampling is off by
default (``--gen-batches 1``): every step rolls out one batch of 16 samples, where the demo's default of up to two
batches would make some steps twice as long as others for reasons that have nothing to do with the dtype.

Each stage is a ``python -m`` child process (its own Ray), run against one retriever (``--retriever-url``, or a
``python -m retriever_server`` this script starts). Per stage it reads ``metrics.jsonl``: seconds per step (mean
over the steps), the phases of an RL step (rollout, old log-probs, actor update) and tokens per second. Then the
speed-ups, ``auto`` over float32. Run it alone: the two dtypes' timings are compared, so anything else on the cores
moves them.

    python bench/dtype_speedup_bench.py                       # ~15 min on 2 cores with AVX512-BF16
    python bench/dtype_speedup_bench.py --retriever-url http://127.0.0.1:8000 --rl-steps 4

``--baseline eager`` compares ``auto`` with ``auto`` whose trainer passes run eager attention
(``model.attn_implementation=eager``) instead of float32: what the default SDPA buys over eager in the same dtype.

Last line: ``dtype_speedup_bench auto=<dtype> baseline=<b> sft_speedup=<x> grpo_step_speedup=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cpu_dtype_bench import cpu_identity, cpu_kind

from search_rl.demo.overrides import sft_overrides, train_overrides
from search_rl.demo.settings import DemoSettings
from search_rl.models.compute_dtype import resolve_compute_dtype

REPO = Path(__file__).resolve().parent.parent

BASELINES = {"float32": ("float32", []), "eager": ("auto", ["model.attn_implementation=eager"])}
"""``--baseline``: (``model.dtype``, further overrides) of the run ``auto`` is compared with."""

RL_PHASES = ("rollout_s", "old_log_prob_s", "update_actor_s", "sync_weights_s")
"""``timing/*`` phases of an RL step the report shows."""


@dataclass
class StageTimes:
    """One training stage's per-step means."""

    step_s: float
    tokens_per_s: float
    phases: dict[str, float]
    steps: int


def read_times(metrics_path: Path) -> StageTimes:
    """Means over the steps of ``metrics.jsonl``."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing/step_s" in r]
    if not rows:
        raise RuntimeError(f"{metrics_path} holds no step timings")
    phases = {p: statistics.fmean(r.get(f"timing/{p}", 0.0) for r in rows) for p in RL_PHASES}
    return StageTimes(
        step_s=statistics.fmean(r["timing/step_s"] for r in rows),
        tokens_per_s=statistics.fmean(r["perf/tokens_per_s"] for r in rows),
        phases=phases,
        steps=len(rows),
    )


def run_stage(module: str, overrides: list[str], log: Path) -> None:
    """``python -m module overrides`` from the repository root, its output to ``log``."""
    cmd = [sys.executable, "-m", module, *overrides]
    print(f"$ {' '.join(cmd)}", flush=True)
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise RuntimeError(f"{module} failed ({done.returncode}); its output: {log}")


def bench(
    url: str, work: Path, sft_steps: int, rl_steps: int, gen_batches: int, baseline: str = "float32"
) -> dict[str, dict[str, StageTimes]]:
    """Warm start and RL stages of the baseline, then of ``auto``; ``{"baseline" | "auto": {"sft": times, "rl":
    times}}``."""
    results: dict[str, dict[str, StageTimes]] = {}
    warm_start: Path | None = None
    for run, (dtype, extra) in (("baseline", BASELINES[baseline]), ("auto", ("auto", []))):
        s = DemoSettings(
            sft_steps=sft_steps,
            sft_batch=8,
            steps=rl_steps,
            prompts=4,
            group_size=4,
            eval_samples=50,
            run_dir=work / run,
            model="smollm2",
            max_turns=2,
            fresh=True,
            gen_batches=gen_batches,
            dtype=dtype,
        )
        t = time.perf_counter()
        run_stage("search_rl.main_sft", [*sft_overrides(s, url, fresh=True), *extra], work / f"{run}_sft.log")
        print(f"{run} warm start: {time.perf_counter() - t:.0f} s", flush=True)
        warm_start = warm_start or s.stage_dir("sft") / f"global_step_{sft_steps}"
        t = time.perf_counter()
        rl = [*train_overrides(s, url, warm_start, fresh=True), *extra]
        run_stage("search_rl.main_ppo", rl, work / f"{run}_rl.log")
        print(f"{run} RL: {time.perf_counter() - t:.0f} s", flush=True)
        results[run] = {stage: read_times(s.stage_dir(stage) / "metrics.jsonl") for stage in ("sft", "rl")}
    return results


def report(results: dict[str, dict[str, StageTimes]], auto_dtype: str, baseline: str = "float32") -> str:
    """The table and the result line."""
    f32, auto = results["baseline"], results["auto"]
    b = baseline if baseline == "float32" else f"auto, {baseline} attention"
    lines = [
        f"| stage | {b} s/step | auto ({auto_dtype}) s/step | speed-up | {b} tok/s | auto tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for stage, name in (("sft", "warm start (main_sft)"), ("rl", "GRPO step (main_ppo)")):
        a, b = f32[stage], auto[stage]
        lines.append(
            f"| {name}, {a.steps} steps | {a.step_s:.1f} | {b.step_s:.1f} | {a.step_s / b.step_s:.2f}x | "
            f"{a.tokens_per_s:.0f} | {b.tokens_per_s:.0f} |"
        )
    for phase in RL_PHASES:
        f32_s, auto_s = f32["rl"].phases[phase], auto["rl"].phases[phase]
        lines.append(f"| RL {phase.removesuffix('_s')} | {f32_s:.1f} | {auto_s:.1f} | | | |")
    sft_x = f32["sft"].step_s / auto["sft"].step_s
    rl_x = f32["rl"].step_s / auto["rl"].step_s
    lines.append(
        f"dtype_speedup_bench auto={auto_dtype} baseline={baseline} sft_speedup={sft_x:.2f} "
        f"grpo_step_speedup={rl_x:.2f}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retriever-url", default="", help="a running retriever (default: start one)")
    ap.add_argument("--sft-steps", type=int, default=10, help="warm-start steps per dtype (the demo's 10)")
    ap.add_argument("--rl-steps", type=int, default=3, help="GRPO steps per dtype (the demo's 3)")
    ap.add_argument("--gen-batches", type=int, default=1, help="generation batches per RL step (1: a fixed workload)")
    ap.add_argument("--baseline", default="float32", choices=sorted(BASELINES), help="what auto is compared with")
    ap.add_argument("--work-dir", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    args = ap.parse_args()
    model, flags = cpu_identity()
    auto_dtype, reason = resolve_compute_dtype("auto", "cpu")
    threads = os.cpu_count()
    print(f"cpu: {model} | kind {cpu_kind(flags)} | flags {' '.join(flags)} | {threads} threads", flush=True)
    print(f"model.dtype=auto -> {auto_dtype} ({reason})", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dtype_speedup_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.retriever_url:
        results = bench(args.retriever_url, work, args.sft_steps, args.rl_steps, args.gen_batches, args.baseline)
    else:
        from retriever_server.launcher import RetrieverProcess, free_port

        server = RetrieverProcess(port=free_port(), ready_timeout_s=3600, log_path=work / "retriever.log")
        server.start()
        try:
            results = bench(server.url, work, args.sft_steps, args.rl_steps, args.gen_batches, args.baseline)
        finally:
            server.stop()
    print(report(results, auto_dtype, args.baseline), flush=True)


if __name__ == "__main__":
    main()
