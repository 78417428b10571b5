"""How far the actor update and the log-prob pass are from this CPU's matrix-multiply limit.

Issue 14 asks for a 4x4 GRPO step of at most 45 s. This script measures the floor the hardware sets for the two
passes that are pure transformer arithmetic:

1. the CPU's matmul rate: ``torch.mm`` on the policy's own linear shapes (one micro-batch of tokens times each weight
   matrix of a decoder layer), in GFLOP/s, the best of the shapes;
2. the update (forward, log-softmax of the loss tokens, backward, AdamW) and the no-grad log-prob pass (old or
   reference log-probs) of ``bench/shared_prompts_bench.py``'s batch, each timed, then run once more under
   ``torch.profiler`` with FLOP counting: the matmul FLOPs they do and the time they spend in matmuls.

3. with ``--lora-rank``, what the adapters cost: forward + backward of each projection shape of a decoder layer,
   the frozen base ``nn.Linear`` alone, wrapped in peft's LoRA layer, and with the adapter fused into the base's
   output (``torch.addmm``, one kernel instead of a matmul, a scale and an add): per layer, and times the layers and
   samples of the update.

The floor of a pass is its matmul FLOPs at the measured rate: no implementation of the same arithmetic on this
device runs faster, whatever it does about attention, norms or Python overhead.

4. the decode floor: decoding is bound by reading the weights once per step, not by FLOPs, so the script measures the
   device's copy bandwidth (a large tensor copied, read + write bytes) and reports the weights' bytes over it: the
   least time a decode step can take at any batch size, and the tokens/s that gives at ``--decode-rows`` rows.

``--device cuda`` runs all of it on the GPU (bf16 by default, CUDA time from the profiler's kernel rows): each phase as
a fraction of its limit there. On a GPU machine, point ``--model`` at a random-weight folder of the real
architecture (``bench/gpu_check.py`` writes them).

    python bench/step_roofline_bench.py --model runs/l14/sft384/global_step_12/actor --lora-rank 16
    python bench/step_roofline_bench.py --model <Qwen2.5-3B folder> --device cuda --lora-rank 0 --prompts 16

Last line: ``step_roofline_bench peak_gflops=<G> update_s=<s> update_floor_s=<s> logprob_s=<s> logprob_floor_s=<s>
bandwidth_gbs=<GB/s> decode_floor_ms=<ms>`` and, with LoRA (CPU), ``projections_base_s=<s> projections_peft_s=<s>
projections_fused_s=<s>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from shared_prompts_bench import add_batch_arguments, build_batch, logprobs, to_device, update
from torch import nn
from torch.profiler import ProfilerActivity, profile

from search_rl.models import load_model, load_tokenizer
from search_rl.models.lora import apply_lora

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")
CPU = torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for ``device`` (CUDA runs asynchronously; a timer must include its work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], repeats: int = 20, device: torch.device = CPU) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls on ``device``, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(
    tokens: int,
    shapes: list[tuple[int, int]],
    repeats: int = 20,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
) -> dict[tuple[int, int], float]:
    """GFLOP/s of ``[tokens, k] @ [k, n]`` for each weight shape ``(k, n)``, the median of ``repeats`` calls."""
    rates = {}
    for k, n in shapes:
        a, b = torch.randn(tokens, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        rates[k, n] = 2 * tokens * k * n / median_seconds(lambda a=a, b=b: a @ b, repeats, device) / 1e9
    return rates


def copy_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 10) -> float:
    """GB/s of copying a ``megabytes`` tensor on ``device``, counting the bytes read and the bytes written."""
    src = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), repeats, device)
    return 2 * src.numel() * src.element_size() / seconds / 1e9


def lora_layer_cost(tokens: int, k: int, n: int, rank: int) -> tuple[float, float, float]:
    """Seconds of forward + backward (to the input and the adapter) of one ``[tokens, k] @ [k, n]`` projection:
    the frozen base alone, peft's LoRA layer around it, and the adapter fused into the base output by ``addmm``."""
    base = nn.Linear(k, n, bias=False)
    base.weight.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0)
    lora = LoraLinear(base, "default", config, r=rank, lora_alpha=2 * rank)
    a, b = lora.lora_A["default"].weight, lora.lora_B["default"].weight
    nn.init.normal_(b, std=0.01)
    x = torch.randn(tokens, k, requires_grad=True)
    grad = torch.randn(tokens, n)

    def fused(inputs: torch.Tensor) -> torch.Tensor:
        return torch.addmm(base(inputs), inputs @ a.T, b.T, alpha=2.0)

    def step(layer: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        return lambda: layer(x).backward(grad)

    return median_seconds(step(base)), median_seconds(step(lora)), median_seconds(step(fused))


def self_time_us(row: Any, device: torch.device) -> float:
    """A profiler row's self time on ``device`` in microseconds (CUDA: its kernels' time)."""
    if device.type != "cuda":
        return float(row.self_cpu_time_total)
    return float(getattr(row, "self_device_time_total", None) or getattr(row, "self_cuda_time_total", 0.0))


def matmul_profile(fn: Callable[[], float], top: int = 6, device: torch.device = CPU) -> tuple[float, float, str]:
    """Run ``fn`` under the profiler; return (matmul FLOPs, seconds spent in matmul kernels, the ``top`` ops by
    self time on ``device`` with their share of the profiled time)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, with_flops=True) as prof:
        fn()
    ops = sorted(prof.key_averages(), key=lambda row: -self_time_us(row, device))
    total = sum(self_time_us(row, device) for row in ops) or 1.0
    names = [row.key.removeprefix("aten::")[:32] for row in ops[:top]]
    shares = ", ".join(f"{name} {self_time_us(row, device) / total:.0%}" for name, row in zip(names, ops, strict=False))
    rows = [row for row in ops if row.key in MATMUL_OPS]
    return float(sum(row.flops for row in rows)), sum(self_time_us(row, device) for row in rows) / 1e6, shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_batch_arguments(ap, "runs/l14/sft384/global_step_12/actor", 364)  # the 384-token recipe's mean response
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each pass (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default=None, help="default: float32 on CPU, bf16 on CUDA"
    )
    ap.add_argument("--decode-rows", type=int, default=64, help="rows of the decode floor's tokens/s")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))

    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model).to(device=device, dtype=dtype)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * head_dim
    shapes = [
        (cfg.hidden_size, cfg.hidden_size),
        (cfg.hidden_size, kv),
        (cfg.hidden_size, cfg.intermediate_size),
        (cfg.intermediate_size, cfg.hidden_size),
    ]
    if args.lora_rank:
        model = apply_lora(model, args.lora_rank, 2 * args.lora_rank, "all-linear")
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-12)
    batch = build_batch(tokenizer, args.prompts, args.samples, args.response_tokens, args.model_tokens, seed=0)
    batch = to_device(batch, device)
    total = int(batch.attention_mask.sum())
    micro_tokens = total // len(batch)
    rates = matmul_rate(micro_tokens, shapes, device=device, dtype=dtype)
    peak = max(rates.values())
    print(
        f"device: {device.type}, {dtype}; batch: {len(batch)} samples, {total} tokens "
        f"(~{micro_tokens} per micro-batch of 1)"
    )
    for (k, n), rate in rates.items():
        print(f"matmul [{micro_tokens} x {k}] @ [{k} x {n}]: {rate:.0f} GFLOP/s")

    passes: dict[str, Callable[[], float]] = {
        "update": lambda: update(model, optimizer, batch, args.mini, True),
        "logprob": lambda: logprobs(model, batch, True),
    }
    passes["update"]()  # warm-up: allocator, thread pools
    results = {}
    for name, fn in passes.items():
        wall = statistics.median(fn() for _ in range(args.repeats))
        flops, mm_s, shares = matmul_profile(fn, device=device)
        floor = flops / (peak * 1e9)
        results[name] = (wall, floor)
        print(
            f"{name}: {wall:.1f} s wall; matmuls {flops / 1e12:.2f} TFLOP, {mm_s:.1f} s under the profiler "
            f"({flops / mm_s / 1e9:.0f} GFLOP/s); floor at {peak:.0f} GFLOP/s: {floor:.1f} s "
            f"({floor / wall:.0%} of the wall time)\n  profiled self time: {shares}",
            flush=True,
        )
    bandwidth = copy_bandwidth(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    decode_floor = weight_bytes / (bandwidth * 1e9)
    print(
        f"decode: weights {weight_bytes / 1e9:.2f} GB, copy bandwidth {bandwidth:.0f} GB/s -> at least "
        f"{decode_floor * 1e3:.2f} ms a step, at most {args.decode_rows / decode_floor:,.0f} tokens/s at "
        f"{args.decode_rows} rows"
    )
    lora_note = ""
    if args.lora_rank and device.type == "cpu":
        layer = {"base": 0.0, "peft": 0.0, "fused": 0.0}
        projections = [(shapes[0], 2), (shapes[1], 2), (shapes[2], 2), (shapes[3], 1)]  # q,o; k,v; gate,up; down
        for (k, n), count in projections:
            costs = lora_layer_cost(args.response_tokens, k, n, args.lora_rank)
            print(
                f"projection [{args.response_tokens} x {k}] @ [{k} x {n}] fwd+bwd: base {costs[0] * 1e3:.2f} ms, "
                f"peft LoRA {costs[1] * 1e3:.2f} ms, fused {costs[2] * 1e3:.2f} ms"
            )
            for name, cost in zip(layer, costs, strict=True):
                layer[name] += count * cost
        scale = cfg.num_hidden_layers * len(batch)
        print(
            f"a decoder layer's projections: base {layer['base'] * 1e3:.1f} ms, peft {layer['peft'] * 1e3:.1f} ms, "
            f"fused {layer['fused'] * 1e3:.1f} ms; x {cfg.num_hidden_layers} layers x {len(batch)} samples: "
            f"{layer['base'] * scale:.1f} / {layer['peft'] * scale:.1f} / {layer['fused'] * scale:.1f} s"
        )
        lora_note = (
            f" projections_base_s={layer['base'] * scale:.1f} projections_peft_s={layer['peft'] * scale:.1f}"
            f" projections_fused_s={layer['fused'] * scale:.1f}"
        )
    print(
        f"step_roofline_bench peak_gflops={peak:.0f} update_s={results['update'][0]:.1f} "
        f"update_floor_s={results['update'][1]:.1f} logprob_s={results['logprob'][0]:.1f} "
        f"logprob_floor_s={results['logprob'][1]:.1f} bandwidth_gbs={bandwidth:.0f} "
        f"decode_floor_ms={decode_floor * 1e3:.2f}{lora_note}"
    )


if __name__ == "__main__":
    main()
