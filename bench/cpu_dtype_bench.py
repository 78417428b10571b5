"""bf16 against float32 on this CPU, at the policy's shapes: the evidence ``model.dtype=auto`` resolves from.

Times, in both dtypes, on this process's threads:

- ``proj``: a SmolLM2-135M projection, ``(tokens x 576) @ (576 x 1536)``;
- ``lm_head``: the LM head, ``(512 x 576) @ (576 x 49152)``;
- ``policy_fwd_bwd``: one forward + backward of a Llama with SmolLM2-135M's shape (random weights; ``--layers`` of
  its 30 layers) on ``--batch`` sequences of ``--seq`` tokens, the parameters cast to the dtype as FSDP2's
  ``MixedPrecisionPolicy`` casts them for the trainer's update.

Each figure is the median of ``--repeats`` timed calls after one untimed call. It prints one line per shape
(milliseconds per call, float32 / bf16 speed-up), the CPU's model name and bf16-related flags, and a verdict:
``bf16`` where the policy's forward + backward ran at least ``--min-speedup`` times faster in bf16, else
``float32`` (where the projection alone shows bf16 emulated, the larger shapes are skipped and
``policy_speedup`` is the projection's). ``auto``'s rules (``search_rl/models/compute_dtype.py``) cite this
script's rows in bench/README.md.

    python bench/cpu_dtype_bench.py                        # ~1 min; on AVX2 it stops after the first shape
    python bench/cpu_dtype_bench.py --layers 30 --repeats 5

Last line: ``cpu_dtype_bench kind=<amx|avx512_bf16|avx2|other> verdict=<bf16|float32> policy_speedup=<x>``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

EMULATED_BELOW = 0.25
"""A bf16 speed-up under this at the first shape means bf16 is emulated (AVX2: ~0.01-0.04x measured): the larger
shapes would take minutes in bf16 and cannot change the verdict, so they are skipped."""

BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "bf16")
"""Flags worth printing beside a row (x86 ``/proc/cpuinfo`` and ARM ``Features``)."""


def cpu_identity() -> tuple[str, list[str]]:
    """This CPU's model name and the flags of ``BF16_FLAGS`` it lists."""
    model, flags = "", set[str]()
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.is_file() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        if key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    model = model or platform.processor() or "unknown"
    return model, [f for f in BF16_FLAGS if f in flags]


def cpu_kind(flags: list[str]) -> str:
    """``amx``, ``avx512_bf16``, ``avx2`` or ``other``: the machine kinds bench/README.md keeps a row for."""
    if "amx_bf16" in flags and "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return "avx2" if "avx2" in flags else "other"


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall milliseconds of ``fn`` over ``repeats`` calls, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def matmul_ms(m: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Milliseconds of ``(m x k) @ (k x n)`` in ``dtype``."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    return median_ms(lambda: a @ b, repeats)


def policy_fwd_bwd_ms(layers: int, batch: int, seq: int, dtype: torch.dtype, repeats: int) -> float:
    """Milliseconds of one forward + backward of SmolLM2-135M's shape at ``layers`` layers, parameters in ``dtype``
    (the loss as the trainer takes it: float32 log-softmax of the logits)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        logits = model(input_ids=ids).logits  # (batch, seq, vocab)
        logp = torch.log_softmax(logits.float(), dim=-1)
        loss = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    return median_ms(step, repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="layers of the policy's shape (SmolLM2-135M has 30)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the projection matmul")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-speedup", type=float, default=1.2, help="policy speed-up at which bf16 is the verdict")
    args = ap.parse_args(argv)

    model, flags = cpu_identity()
    kind = cpu_kind(flags)
    print(f"cpu: {model} | kind {kind} | flags {' '.join(flags) or '-'} | threads {torch.get_num_threads()}")
    print(f"torch {torch.__version__}")
    shapes: dict[str, Callable[[torch.dtype], float]] = {
        "proj": lambda dt: matmul_ms(args.tokens, 576, 1536, dt, args.repeats),
        "lm_head": lambda dt: matmul_ms(512, 576, 49152, dt, args.repeats),
        "policy_fwd_bwd": lambda dt: policy_fwd_bwd_ms(args.layers, args.batch, args.seq, dt, args.repeats),
    }
    speedups: dict[str, float] = {}
    for name, run in shapes.items():
        fp32, bf16 = run(torch.float32), run(torch.bfloat16)
        speedups[name] = fp32 / bf16
        print(f"{name:15s} float32 {fp32:10.1f} ms | bf16 {bf16:10.1f} ms | bf16 speed-up {speedups[name]:.2f}x")
        if speedups[name] < EMULATED_BELOW:
            print(f"bf16 is emulated here ({speedups[name]:.2f}x at {name}): the other shapes are not timed")
            break
    policy = speedups.get("policy_fwd_bwd", min(speedups.values()))
    verdict = "bf16" if policy >= args.min_speedup else "float32"
    print(f"cpu_dtype_bench kind={kind} verdict={verdict} policy_speedup={policy:.2f} layers={args.layers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
