"""Where the static engine's decode step spends its time: ``torch.profiler`` over its decode steps at real shapes.

For each ``--arch`` and ``--rows`` (rows decoded together: ``max_batch_size`` = rows), on random weights, the static
engine with graphs and compile asked for on CUDA (left null they stay off until the engine passes the GPU round)
makes a warm-up call (captures, compiles), then two profiled calls on fresh prompts: a prefill call (each row's first
token, read back at once) and a call of ``1 + S`` tokens, ``S`` = ``--steps`` rounded up to whole readback blocks
(8 steps on CUDA: 20 asked give 24). What the second call did beyond the first is ``S`` decode steps and their
readbacks. Per decode step:

- ``kernels``: device kernels launched (on CPU, where there are none, top-level ``aten::`` ops stand in);
- ``step_ms``: wall time; ``busy_ms``: time at least one kernel ran (the union of their intervals);
- ``idle_share`` = 1 - busy / wall: the device waiting on the host (launches, Python, readbacks);
- the 10 kernels that took the most time, with their share of the busy time.

A step that does not launch its kernels from a captured graph shows as many more kernels and a larger idle share.
If the profiler sees no kernels inside graph replays (a CUPTI without graph-node tracing), ``kernels`` reads 0.

    python bench/decode_profile.py --arch qwen2.5-3b smollm2-135m --rows 64 256 --out /tmp/profile.json     # GPU
    python bench/decode_profile.py --arch smollm2-135m --layers 2 --rows 4 --prompt-tokens 32 --device cpu  # CPU

One line per (arch, rows): ``decode_profile arch=<a> rows=<n> steps=<S> kernels=<k> step_ms=<t> busy_ms=<t>
idle_share=<f> device=<d>``, then its top kernels; ``--out`` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from search_rl.config import HFEngineConfig, StaticEngineConfig
from search_rl.datatypes import SamplingParams
from search_rl.models import load_tokenizer
from search_rl.rollout.engines.factory import build_static_engine
from search_rl.rollout.engines.static import StaticEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ARCHS  # noqa: E402
from static_engine_bench import build_model  # noqa: E402

TOP = 10


def _kernels(events: Any, device: torch.device) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of each device kernel (on CPU: each top-level ``aten::`` op)."""
    if device.type == "cuda":
        chosen = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        chosen = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
    return [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in chosen]


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of ``intervals`` (their union).

    >>> busy_us([(0, 10), (5, 12), (20, 25)])
    17.0
    """
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def profiled(fn: Callable[[], object], device: torch.device) -> tuple[float, list[tuple[str, float, float]]]:
    """(wall seconds, kernels) of ``fn`` under the profiler."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    return wall, _kernels(prof.events(), device)


def decode_profile(engine: StaticEngine, rows: int, prompt_tokens: int, steps: int, vocab: int) -> dict[str, Any]:
    """The per-step figures of ``steps`` decode steps of ``rows`` rows (module docstring)."""
    device = engine.device
    block = engine.readback_steps
    steps = -(-steps // block) * block  # whole readback blocks: the call ends at a readback
    gen = torch.Generator().manual_seed(rows)
    sets = [torch.randint(100, vocab, (rows, prompt_tokens), generator=gen).tolist() for _ in range(3)]
    params = SamplingParams(max_new_tokens=1 + steps, temperature=1.0, seed=0)
    engine.generate(sets[0], params)  # warm-up: captures, compiles
    engine.readback_steps = 1  # the prefill call reads back at once (its rows end on their first token)
    try:
        prefill_s, prefill = profiled(
            lambda: engine.generate(sets[1], SamplingParams(max_new_tokens=1, seed=0)), device
        )
    finally:
        engine.readback_steps = block
    full_s, full = profiled(lambda: engine.generate(sets[2], params), device)
    per_name: dict[str, float] = defaultdict(float)
    for name, start, end in full:
        per_name[name] += end - start
    for name, start, end in prefill:
        per_name[name] -= end - start
    busy = busy_us([(s, e) for _, s, e in full]) - busy_us([(s, e) for _, s, e in prefill])
    wall_us = (full_s - prefill_s) * 1e6
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:TOP]
    return {
        "rows": rows,
        "steps": steps,
        "kernels": (len(full) - len(prefill)) / steps,
        "step_ms": wall_us / steps / 1e3,
        "busy_ms": busy / steps / 1e3,
        "idle_share": 1 - busy / wall_us if wall_us > 0 else float("nan"),
        "top": [
            {"kernel": k, "ms": us / steps / 1e3, "share": us / busy if busy > 0 else float("nan")} for k, us in top
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", choices=sorted(ARCHS), default=["qwen2.5-3b", "smollm2-135m"])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--layers", type=int, default=None, help="keep this many decoder layers of each shape")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda where available")
    ap.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: SmolLM2's)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer()
    results = []
    for arch in args.arch:
        model = build_model(arch, tokenizer, dtype, device, args.layers)
        cfg = HFEngineConfig(max_batch_size=max(args.rows))
        on_cuda = device.type == "cuda"
        static = StaticEngineConfig(cuda_graphs=on_cuda, compile=on_cuda)
        engine = build_static_engine(cfg, static, model, tokenizer)
        for rows in args.rows:
            figures = decode_profile(engine, rows, args.prompt_tokens, args.steps, min(len(tokenizer), 40000))
            found = {"arch": arch, "device": name, **figures}
            results.append(found)
            print(
                f"decode_profile arch={arch} rows={rows} steps={found['steps']} kernels={found['kernels']:.0f} "
                f"step_ms={found['step_ms']:.2f} busy_ms={found['busy_ms']:.2f} "
                f"idle_share={found['idle_share']:.3f} device={name.replace(' ', '_')}",
                flush=True,
            )
            for top in found["top"]:
                print(f"  {top['ms']:8.3f} ms/step {top['share']:6.1%}  {top['kernel'][:110]}")
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
