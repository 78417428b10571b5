"""What one decode step of the HF rollout engine costs, and what bounds it.

A rollout step from the warm start is ~60% decode (one token per active sample per step, each step a full forward of
the policy over the new tokens against the KV cache). This times a decode step of the real policy at several batch
sizes (rows) after a prefill of ``--context`` tokens, with transformers' ``DynamicCache`` (which concatenates every
layer's keys and values each step) and with a cache that writes into reserved capacity instead; then the matmuls alone:
the 30 layers' projections and the vocabulary projection over distinct weights (streamed from memory, as in the
model), fp32 and bf16.

    python bench/decode_step_bench.py --model runs/l14/sft384/global_step_12/actor

Last line: ``decode_step_bench step_ms_r16=<x> reserved_ms_r16=<y> matmul_ms_r16_fp32=<z> matmul_ms_r16_bf16=<w>``.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from search_rl.models import load_model
from search_rl.models.loading import CACHE_KWARG


class ReservedLayer(DynamicLayer):
    """A cache layer that writes new states into reserved capacity (doubling when full) instead of ``torch.cat``."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def update(self, key_states, value_states, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self._n, key_states.shape[-2]
        if self._k is None or self._v is None or n + m > self._k.shape[-2]:
            cap = max(n + m + 64, 2 * (self._k.shape[-2] if self._k is not None else 0))
            k = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if self._k is not None and self._v is not None and n:
                k[..., :n, :], v[..., :n, :] = self._k[..., :n, :], self._v[..., :n, :]
            self._k, self._v = k, v
        self._k[..., n : n + m, :], self._v[..., n : n + m, :] = key_states, value_states
        self._n = n + m
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]
        return self.keys, self.values


def decode_ms(model, rows: int, context: int, reserved: bool, steps: int) -> float:  # type: ignore[no-untyped-def]
    """Mean ms of ``steps`` decode steps after a prefill of ``context`` tokens (half the rows padded)."""
    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (rows, context))
    attention = torch.ones(rows, context, dtype=torch.long)
    attention[: rows // 2, :20] = 0
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    if reserved:
        cache.layers = [ReservedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]

    def forward(tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> None:
        model(
            input_ids=tokens,
            attention_mask=attention,
            position_ids=positions,
            **{CACHE_KWARG: cache},
            use_cache=True,
            logits_to_keep=1,
        )

    with torch.inference_mode():
        forward(ids, attention, positions)
        token, last = torch.randint(100, 40000, (rows, 1)), positions[:, -1:]
        times = []
        for i in range(steps + 3):
            attention = torch.cat([attention, attention.new_ones((rows, 1))], 1)
            last = last + 1
            start = time.perf_counter()
            forward(token, attention, last)
            if i >= 3:
                times.append(time.perf_counter() - start)
    return 1e3 * sum(times) / len(times)


def matmul_ms(model, rows: int, dtype: torch.dtype, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    """ms of every projection of the model plus the vocabulary projection for ``rows`` tokens, in ``dtype``."""
    weights = [m.weight.detach().to(dtype) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    embed = model.get_output_embeddings().weight.detach().to(dtype)
    if all(w.data_ptr() != embed.data_ptr() for w in weights):
        weights.append(embed)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w in weights}
    with torch.inference_mode():
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)
        start = time.perf_counter()
        for _ in range(repeats):
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1]], w)
    return 1e3 * (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="policy folder (e.g. the warm start's actor)")
    ap.add_argument("--context", type=int, default=550, help="tokens in the cache before decoding (prompt + turn 1)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    model = load_model(args.model).eval()
    print(f"threads={torch.get_num_threads()} context={args.context}")
    out: dict[str, float] = {}
    for rows in args.rows:
        plain = decode_ms(model, rows, args.context, reserved=False, steps=args.steps)
        reserved = decode_ms(model, rows, args.context, reserved=True, steps=args.steps)
        fp32, bf16 = matmul_ms(model, rows, torch.float32), matmul_ms(model, rows, torch.bfloat16)
        print(
            f"rows={rows}: decode step {plain:.1f} ms (DynamicCache), {reserved:.1f} ms (reserved cache); "
            f"matmuls alone {fp32:.1f} ms fp32, {bf16:.1f} ms bf16"
        )
        out.update({f"step_ms_r{rows}": plain, f"reserved_ms_r{rows}": reserved})
        out.update({f"matmul_ms_r{rows}_fp32": fp32, f"matmul_ms_r{rows}_bf16": bf16})
    last = max(args.rows)
    keys = (f"step_ms_r{last}", f"reserved_ms_r{last}", f"matmul_ms_r{last}_fp32", f"matmul_ms_r{last}_bf16")
    print("decode_step_bench " + " ".join(f"{k}={out[k]:.1f}" for k in keys))


if __name__ == "__main__":
    main()
