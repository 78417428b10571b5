"""One decode step's attention for one layer, at a real model's head layout: transformers' ``sdpa`` (which, before
5.23, copies the keys and values once per query head of a group when a mask is passed) against the static engine's
``packed_decode`` attention (each KV head's query heads packed as its query rows; no copy).

The static engine always passes a mask, so the first is what its decode steps ran on transformers < 5.23. Inputs
are random, in the shapes of a ``--slots``-row decode step over ``--columns`` cache columns; the mask hides the
last quarter of each row's columns. Also printed: the bytes each path moves per step for the whole model (KV read,
plus the copies' write and read), the floor at ``--bandwidth`` GB/s of that.

    python bench/decode_attention_bench.py --arch qwen2.5-3b --slots 64 --columns 512 2048

One line per columns value: ``decode_attention_bench arch=<a> transformers=<v> slots=<n> columns=<L>
sdpa_ms=<per layer> packed_ms=<per layer> speedup=<x> model_sdpa_gb=<GB per step> model_packed_gb=<GB per step>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from search_rl.rollout.engines.hf.packed_decode import TRANSFORMERS_PACKS_GQA, packed_sdpa_attention

sys.path.insert(0, str(Path(__file__).parent))
from gpu_check import ARCHS  # noqa: E402


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def time_ms(fn, device: torch.device, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of ``fn()`` over ``repeats`` calls after 3 warm-ups."""
    times = []
    for i in range(repeats + 3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen2.5-3b")
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--columns", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s for the floor (H200 HBM: 4800)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    fields = ARCHS[args.arch].fields
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    dim = fields.get("head_dim") or fields["hidden_size"] // heads
    layers = fields["num_hidden_layers"]
    layer = _Layer(heads // kv_heads)
    print(
        f"{args.arch}: {heads} query heads over {kv_heads} KV heads of {dim}, {layers} layers; {dtype} on {device}; "
        f"transformers {transformers.__version__} (packs grouped queries itself: {TRANSFORMERS_PACKS_GQA})"
    )
    for columns in args.columns:
        g = torch.Generator(device=device).manual_seed(0)
        query = torch.randn(args.slots, heads, 1, dim, generator=g, device=device, dtype=dtype)
        key, value = (torch.randn(args.slots, kv_heads, columns, dim, generator=g, device=device, dtype=dtype)
                      for _ in range(2))  # fmt: skip
        visible = torch.arange(columns, device=device) < columns * 3 // 4
        mask = torch.zeros(args.slots, 1, 1, columns, device=device, dtype=dtype)
        mask = mask.masked_fill(~visible, torch.finfo(dtype).min)
        inputs = (layer, query, key, value, mask)
        sdpa = time_ms(lambda a=inputs: sdpa_attention_forward(*a, scaling=dim**-0.5), device, args.repeats)
        packed = time_ms(lambda a=inputs: packed_sdpa_attention(*a, scaling=dim**-0.5), device, args.repeats)
        kv_gb = 2 * key.numel() * key.element_size() * layers / 1e9  # keys + values, all layers
        copies = 0.0 if TRANSFORMERS_PACKS_GQA else 2 * kv_gb * heads / kv_heads  # written, then read
        print(
            f"columns={columns}: sdpa {sdpa:.2f} ms, packed {packed:.2f} ms per layer; per step ({layers} layers): KV "
            f"{kv_gb:.2f} GB, with sdpa's copies {kv_gb + copies:.2f} GB (floor at {args.bandwidth:.0f} GB/s: "
            f"{(kv_gb + copies) / args.bandwidth * 1e3:.2f} vs {kv_gb / args.bandwidth * 1e3:.2f} ms)"
        )
        print(
            f"decode_attention_bench arch={args.arch} transformers={transformers.__version__} slots={args.slots} "
            f"columns={columns} sdpa_ms={sdpa:.2f} packed_ms={packed:.2f} speedup={sdpa / packed:.2f} "
            f"model_sdpa_gb={kv_gb + copies:.2f} model_packed_gb={kv_gb:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
