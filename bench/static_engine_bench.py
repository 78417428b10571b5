"""Generation tokens/s of the HF engine and the static engine (static KV cache; CUDA-graph decoding on CUDA), on
whatever device is present, same prompts and sampling.

Each engine generates ``--new-tokens`` tokens (temperature 1, seeded, the rollout's stop strings checked every step)
for ``--seqs`` random prompts of ``--prompt-tokens`` tokens; tokens/s = generated tokens / wall time of one call,
after a first, untimed call of the same shape (which captures the static engine's graphs; its time is printed as
``first_s``). Models have random weights: ``tiny`` (the test model) or a real architecture's shapes (``--arch``,
those of ``bench/gpu_check.py``).

    python bench/static_engine_bench.py --arch tiny --seqs 64 256 --prompt-tokens 64 --new-tokens 32   # CPU
    python bench/static_engine_bench.py --arch qwen2.5-3b --dtype bfloat16 --seqs 64 256                # GPU

Engines: ``hf``; ``static`` (CUDA graphs) and ``static-eager``; their ``-unpacked`` forms decode with transformers'
own attention instead of ``packed_decode`` (the same thing from transformers 5.23; before it, the KV cache copied per
query head each step); ``transformers-cb`` (transformers' ``generate_batch``). ``--layers N`` keeps N decoder layers of
a real shape, to measure its per-layer cost on a small machine.

One line per (engine, seqs): ``static_engine_bench engine=<e> arch=<a> device=<d> seqs=<n> tok_s=<x> first_s=<s>``.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers

from search_rl.config import HFEngineConfig
from search_rl.datatypes import SamplingParams
from search_rl.models import build_tiny_model, load_tokenizer
from search_rl.rollout.engines.base import RolloutEngine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.packed_decode import TRANSFORMERS_PACKS_GQA
from search_rl.rollout.engines.static import StaticEngine
from search_rl.tags import STOP_STRINGS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ARCHS  # noqa: E402


def build_model(  # type: ignore[no-untyped-def]
    arch: str, tokenizer, dtype: torch.dtype, device: torch.device, layers: int | None = None
) -> transformers.PreTrainedModel:
    """A random-weight model of ``arch`` (``tiny``: the tests' 2-layer Llama) in ``dtype`` on ``device``; ``layers``
    keeps that many of its decoder layers (a real shape's per-layer cost on a small machine)."""
    if arch == "tiny":
        model = build_tiny_model(tokenizer, seed=0)
    else:
        spec = ARCHS[arch]
        fields = {**spec.fields, **({"num_hidden_layers": layers} if layers else {})}
        config = getattr(transformers, spec.config_class)(
            **fields,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        with torch.device(device):  # a large model's init is slow on CPU
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    torch.nn.Module.to(model, device=device, dtype=dtype)
    return model.eval()


def time_call(
    engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams, device: torch.device
) -> tuple[float, int]:
    """(wall seconds, generated tokens) of one ``generate`` call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, sum(len(g.token_ids) for g in out)


def measure(  # type: ignore[no-untyped-def]
    engine_name: str,
    model: transformers.PreTrainedModel,
    tokenizer,
    cfg: HFEngineConfig,
    prompts: list[list[int]],
    params: SamplingParams,
    device: torch.device,
) -> tuple[float, float, int]:
    """(first call's seconds, timed call's seconds, generated tokens) of one engine on ``prompts``."""
    if engine_name == "transformers-cb":
        return time_continuous_batching(model, tokenizer, prompts, params, device)
    if engine_name == "hf":
        engine: RolloutEngine = HFEngine(model, tokenizer, cfg)
    else:
        static = StaticEngine(model, tokenizer, cfg, cuda_graphs=not engine_name.startswith("static-eager"))
        if engine_name.endswith("-unpacked"):  # transformers' own decode attention, whatever its version does
            static.packed_decode = False
        engine = static
    first, _ = time_call(engine, prompts, params, device)
    seconds, tokens = time_call(engine, prompts, params, device)
    return first, seconds, tokens


def time_continuous_batching(  # type: ignore[no-untyped-def]
    model: transformers.PreTrainedModel,
    tokenizer,
    prompts: list[list[int]],
    params: SamplingParams,
    device: torch.device,
) -> tuple[float, float, int]:
    """transformers' own continuous batching (``generate_batch``, paged attention) on the same prompts: the same
    token budget and sampling temperature, EOS as its only stop (it has no stop strings), for comparison."""
    gen_cfg = transformers.GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        do_sample=True,
        temperature=params.temperature,
        top_k=0,
        top_p=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    times, tokens = [], 0
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=gen_cfg)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        tokens = sum(len(o.generated_tokens) for o in out.values())
    return times[0], times[1], tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["tiny", *sorted(ARCHS)], default="tiny")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-batch-size", type=int, default=64, help="rollout.hf.max_batch_size of both engines")
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=["hf", "static", "static-eager", "static-unpacked", "static-eager-unpacked", "transformers-cb"],
        default=["hf", "static"],
    )
    ap.add_argument("--layers", type=int, default=None, help="keep this many decoder layers of --arch")
    ap.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: SmolLM2's)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer()
    model = build_model(args.arch, tokenizer, dtype, device, args.layers)
    cfg = HFEngineConfig(max_batch_size=args.max_batch_size)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"{args.arch}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {dtype}, {name}, "
        f"transformers {transformers.__version__}, packed decode attention {not TRANSFORMERS_PACKS_GQA}"
    )
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop=STOP_STRINGS, seed=0)
    gen = torch.Generator().manual_seed(0)
    for seqs in args.seqs:
        prompts = torch.randint(100, min(len(tokenizer), 40000), (seqs, args.prompt_tokens), generator=gen).tolist()
        for engine_name in args.engines:
            try:
                first, seconds, tokens = measure(engine_name, model, tokenizer, cfg, prompts, params, device)
            except Exception as e:  # one engine failing on a new device still lets the others report
                traceback.print_exc()
                print(f"static_engine_bench engine={engine_name} arch={args.arch} seqs={seqs} error={e!r:.200}")
                continue
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            print(
                f"static_engine_bench engine={engine_name} arch={args.arch} device={name.replace(' ', '_')} "
                f"seqs={seqs} tok_s={tokens / seconds:.0f} first_s={first:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
