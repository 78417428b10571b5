"""Generation tokens/s of the rollout engines as a user pays for them: fresh prompts, prefill included, on whatever
device is present, same prompts and sampling for every engine.

Method. For each engine and ``--seqs`` size:

1. a warm-up call on prompts of the same shape as the timed ones; its wall time is ``first_s`` (one-time costs: graph
   capture, ``torch.compile``, the stop-string screen, cuBLAS/oneDNN start-up);
2. a prefill call on fresh prompts with ``max_new_tokens=1`` (prefill + the first token): ``prefill_s``;
3. a full call on other fresh prompts of the same shape: ``full_s``. ``decode_s = full_s - prefill_s``.

Printed: ``prefill_tok_s`` = prompt tokens / ``prefill_s``; ``decode_tok_s`` = tokens of the decode steps (all but
each sequence's first) / ``decode_s``; ``tok_s`` = generated tokens / ``full_s`` (end to end, what a rollout pays);
``roofline`` = the least time the decode steps could take at the device's memory bandwidth over ``decode_s``: a step
must read the weights in their dtype (the input embedding only where it is not the output head) and each running
row's KV cache at the mean width of the decode (prompt + half the new tokens), at H100 SXM 3.35 TB/s or H200 4.8 TB/s
(datasheets); on a CPU at the copy bandwidth measured once (``bench/step_roofline_bench.py``'s ``copy_bandwidth``);
``na`` elsewhere. Prompts are random ids, so no call reuses another's states (``reused_tokens=0``) unless ``--reuse``
times every call on the warm-up prompts (what this script did before: decode-only figures, the timed call reused
255 of 256 prompt tokens). The static engine reads back every 8 steps on CUDA, so a call whose rows all end on their
first token would still run 8 decode steps; its prefill call runs with one step per readback, which ends it after
the prefill.

``--case search-r1``: ~300-token prompts (270-330), a 64-token first turn, then a second turn whose prompt is the first
turn's sequence + a 384-token observation (random ids) + 64 more tokens. Turn 2 reuses turn 1's states, as a rollout
does (``reused_tokens`` says how many); each turn has its own line, timed as above (turn 2's prefill and full calls
each follow a first turn of their own prompts).

Models have random weights: ``tiny`` (the test model) or a real architecture's shapes (``--arch``, those of
``bench/gpu_check.py``); ``--layers N`` keeps N decoder layers of a real shape (a small machine's per-layer cost).

    python bench/static_engine_bench.py --arch tiny --seqs 8                                          # CPU
    python bench/static_engine_bench.py --arch qwen2.5-3b --seqs 64 256 --max-batch-size 256           # GPU, bf16
    python bench/static_engine_bench.py --arch smollm2-135m --case search-r1 --seqs 64 --engines static

Engines: ``hf``; ``static`` (CUDA graphs on CUDA, compile off: both asked for explicitly, since ``rollout.static``
left null keeps them off until the engine passes the GPU round); ``static-eager`` (no graphs); ``static-compiled``
(compile on, graphs on CUDA); ``transformers-cb`` (transformers' ``generate_batch``, EOS its only stop, no reuse).
One line per (engine, case, turn, seqs)::

    static_engine_bench engine=<e> arch=<a> case=<c> turn=<t> seqs=<n> max_batch=<b> prompt_tokens=<p>
    new_tokens=<k> prefill_tok_s=<x> decode_tok_s=<x> tok_s=<x> first_s=<s> roofline=<f|na> reused_tokens=<n>
    dtype=<d> device=<d> commit=<hash[+dirty]> torch=<v> transformers=<v>

Exits 1 if an engine failed (after the others' lines).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from search_rl.config import HFEngineConfig, StaticEngineConfig
from search_rl.datatypes import SamplingParams
from search_rl.models import build_tiny_model, load_tokenizer
from search_rl.rollout.engines.factory import build_static_engine
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.engines.in_process import InProcessEngine
from search_rl.rollout.engines.static import StaticEngine
from search_rl.tags import STOP_STRINGS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ARCHS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENGINES = ("hf", "static", "static-eager", "static-compiled", "transformers-cb")
PEAK_BANDWIDTH_GBS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100 NVL": 3900.0, "H100": 3350.0}
"""HBM bandwidth from the datasheets, by a part of the device name (more specific names first)."""
SEARCH_R1 = {"prompt": (270, 330), "turn_tokens": 64, "observation": 384}
"""The Search-R1-shaped case: prompt lengths, tokens per turn, observation tokens between the turns."""


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


class Runner:
    """One engine under test: ``generate(prompts, new_tokens, prefill)`` returns each prompt's generated ids."""

    def __init__(self, name: str, model: Any, tokenizer: Any, cfg: HFEngineConfig, params: SamplingParams) -> None:
        self.name, self.model, self.tokenizer, self.params = name, model, tokenizer, params
        self.engine: InProcessEngine | None = None
        if name == "hf":
            self.engine = HFEngine(model, tokenizer, cfg)
        elif name.startswith("static"):
            # Asked for explicitly: left null, build_static_engine keeps graphs and compile off until the engine
            # has passed the GPU round, and the rows would all measure eager decoding.
            on_cuda = model.device.type == "cuda"
            static = StaticEngineConfig(
                cuda_graphs=on_cuda and name != "static-eager", compile=name == "static-compiled"
            )
            self.engine = build_static_engine(cfg, static, model, tokenizer)

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens the engine did not encode because it had their states (0 for transformers-cb)."""
        return self.engine.prefix.stats.reused_tokens if self.engine is not None else 0

    def generate(self, prompts: list[list[int]], new_tokens: int, prefill: bool = False) -> list[list[int]]:
        params = dataclasses.replace(self.params, max_new_tokens=new_tokens)
        if self.engine is None:
            return self._generate_batch(prompts, params)
        engine = self.engine
        readback = engine.readback_steps if isinstance(engine, StaticEngine) else None
        if prefill and isinstance(engine, StaticEngine):
            engine.readback_steps = 1  # read back after the prefill: the rows are done (module docstring)
        try:
            return [list(g.token_ids) for g in engine.generate(prompts, params)]
        finally:
            if isinstance(engine, StaticEngine) and readback is not None:
                engine.readback_steps = readback

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """transformers' continuous batching on the same prompts: the same budget and temperature, EOS its only stop
        (it has no stop strings)."""
        gen_cfg = transformers.GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=True,
            temperature=params.temperature,
            top_k=0,
            top_p=1.0,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        out = self.model.generate_batch(inputs=prompts, generation_config=gen_cfg)
        return [list(o.generated_tokens) for o in out.values()]


def timed(fn: Callable[[], list[list[int]]], device: torch.device) -> tuple[float, list[list[int]]]:
    """(wall seconds, result) of ``fn``, the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


@dataclasses.dataclass
class Measured:
    """One line's measurements."""

    prompt_tokens: int
    prefill_s: float
    full_s: float
    generated: int
    seqs: int
    first_s: float
    reused_tokens: int
    mean_width: float

    @property
    def decode_s(self) -> float:
        return self.full_s - self.prefill_s

    def rates(self) -> tuple[float, float | None, float]:
        """(prefill tok/s, decode tok/s or None when the decode took no measurable time, end-to-end tok/s)."""
        decode = (self.generated - self.seqs) / self.decode_s if self.decode_s > 0 else None
        return self.prompt_tokens / self.prefill_s, decode, self.generated / self.full_s


def decode_bytes(model: Any, rows: int, mean_width: float) -> float:
    """Bytes one decode step of ``rows`` rows must read: the weights in their dtype (the input embedding only where it
    is not the output head) and each row's KV cache up to ``mean_width`` columns."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if embed is not head:  # a decode step gathers a few embedding rows, not the table
        weights -= embed.numel() * embed.element_size()
    text = model.config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_per_token = 2 * text.num_hidden_layers * kv_heads * head_dim * embed.element_size()
    return float(weights + rows * mean_width * kv_per_token)


def roofline(model: Any, m: Measured, rows: int, bandwidth_gbs: float | None) -> float | None:
    """Fraction of the memory-bandwidth limit the decode reached (None without a bandwidth or a decode time)."""
    if bandwidth_gbs is None or m.decode_s <= 0:
        return None
    steps = (m.generated - m.seqs) / rows
    return steps * decode_bytes(model, rows, m.mean_width) / (bandwidth_gbs * 1e9) / m.decode_s


def measure_plain(run: Runner, sets: list[list[list[int]]], new: int, device: torch.device) -> Measured:
    """Warm-up on ``sets[0]``, prefill call on ``sets[1]``, full call on ``sets[2]`` (module docstring)."""
    first_s, _ = timed(lambda: run.generate(sets[0], new), device)
    before = run.reused_tokens
    prefill_s, _ = timed(lambda: run.generate(sets[1], 1, prefill=True), device)
    full_s, out = timed(lambda: run.generate(sets[2], new), device)
    width = sum(map(len, sets[2])) / len(sets[2]) + new / 2
    return Measured(
        sum(map(len, sets[1])), prefill_s, full_s, sum(map(len, out)), len(out), first_s,
        run.reused_tokens - before, width,
    )  # fmt: skip


@dataclasses.dataclass
class Turns:
    """Two turns of the Search-R1 case on one prompt set: seconds, generated ids and reused tokens of each."""

    follow: list[list[int]]
    """The second turn's prompts: each first turn's sequence and an observation."""
    first: list[list[int]]
    second: list[list[int]]
    first_s: float
    second_s: float
    reused_first: int
    reused_second: int


def two_turns(
    run: Runner, prompts: list[list[int]], second_new: int, gen: torch.Generator, vocab: int, device: torch.device
) -> Turns:
    """A first turn of ``SEARCH_R1["turn_tokens"]`` tokens, then a second of ``second_new`` (1: a prefill call) on
    each first turn's sequence followed by an observation of random ids."""
    before = run.reused_tokens
    first_s, first = timed(lambda: run.generate(prompts, SEARCH_R1["turn_tokens"]), device)
    middle = run.reused_tokens
    obs = torch.randint(100, vocab, (len(prompts), SEARCH_R1["observation"]), generator=gen).tolist()
    follow = [p + f + o for p, f, o in zip(prompts, first, obs, strict=True)]
    second_s, second = timed(lambda: run.generate(follow, second_new, prefill=second_new == 1), device)
    return Turns(follow, first, second, first_s, second_s, middle - before, run.reused_tokens - middle)


def measure_search_r1(
    run: Runner, sets: list[list[list[int]]], gen: torch.Generator, vocab: int, device: torch.device
) -> tuple[Measured, Measured]:
    """Turn 1 and turn 2 of the Search-R1 case (module docstring) on four prompt sets: warm-up, turn-1 prefill,
    turn-1 full + turn-2 prefill, turn-2 full."""
    k = SEARCH_R1["turn_tokens"]
    warm = two_turns(run, sets[0], k, gen, vocab, device)
    before = run.reused_tokens
    prefill_s, _ = timed(lambda: run.generate(sets[1], 1, prefill=True), device)
    reused = run.reused_tokens - before
    b = two_turns(run, sets[2], 1, gen, vocab, device)
    c = two_turns(run, sets[3], k, gen, vocab, device)
    turn1 = Measured(
        sum(map(len, sets[1])), prefill_s, b.first_s, sum(map(len, b.first)), len(b.first),
        warm.first_s, reused + b.reused_first, sum(map(len, sets[2])) / len(sets[2]) + k / 2,
    )  # fmt: skip
    turn2 = Measured(
        sum(map(len, b.follow)), b.second_s, c.second_s, sum(map(len, c.second)), len(c.second),
        warm.second_s, b.reused_second + c.reused_second, sum(map(len, c.follow)) / len(c.follow) + k / 2,
    )  # fmt: skip
    return turn1, turn2


def source_commit() -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it (``SEARCH_RL_COMMIT`` wins: a copy
    of the tree without ``.git``); ``unknown`` without either."""
    if found := os.environ.get("SEARCH_RL_COMMIT"):
        return found
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_bandwidth(device: torch.device, given: float | None) -> float | None:
    """GB/s of the device's memory: ``given``, the datasheet figure of a known GPU, or the CPU's copy bandwidth."""
    if given is not None:
        return given
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_BANDWIDTH_GBS.items() if k in name), None)
    from step_roofline_bench import copy_bandwidth

    return copy_bandwidth(device)


def prompt_sets(
    count: int, seqs: int, lengths: tuple[int, int], vocab: int, gen: torch.Generator
) -> list[list[list[int]]]:
    """``count`` sets of ``seqs`` random-id prompts, lengths drawn from ``lengths`` (inclusive)."""
    sets = []
    for _ in range(count):
        sizes = torch.randint(lengths[0], lengths[1] + 1, (seqs,), generator=gen).tolist()
        sets.append([torch.randint(100, vocab, (n,), generator=gen).tolist() for n in sizes])
    return sets


def _fmt(x: float | None, digits: int = 0) -> str:
    return "na" if x is None else f"{x:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["tiny", *sorted(ARCHS)], default="tiny")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda where available")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--case", choices=["plain", "search-r1"], default="plain")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="plain case")
    ap.add_argument("--new-tokens", type=int, default=128, help="plain case")
    ap.add_argument("--max-batch-size", type=int, default=64, help="rollout.hf.max_batch_size: rows decoded at once")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=["hf", "static"])
    ap.add_argument("--reuse", action="store_true", help="time every call on the warm-up prompts (plain case)")
    ap.add_argument("--layers", type=int, default=None, help="keep this many decoder layers of --arch")
    ap.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: SmolLM2's)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="memory bandwidth for roofline= (default above)")
    args = ap.parse_args()
    if args.reuse and args.case != "plain":
        ap.error("--reuse applies to --case plain (the search-r1 case's second turn reuses by design)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer()
    model = build_model(args.arch, tokenizer, dtype, device, args.layers)
    cfg = HFEngineConfig(max_batch_size=args.max_batch_size)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = device_bandwidth(device, args.bandwidth_gbs)
    common = (
        f"dtype={str(dtype).removeprefix('torch.')} device={name.replace(' ', '_')} commit={source_commit()} "
        f"torch={torch.__version__} transformers={transformers.__version__}"
    )
    print(f"{args.arch}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; {common}; "
          f"bandwidth {_fmt(bandwidth, 1)} GB/s", flush=True)  # fmt: skip
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop=STOP_STRINGS, seed=0)
    vocab = min(len(tokenizer), 40000)
    failed = []
    for seqs in args.seqs:
        for engine_name in args.engines:
            gen = torch.Generator().manual_seed(seqs)  # every engine gets the same prompts
            run: Runner | None = None
            try:
                run = Runner(engine_name, model, tokenizer, cfg, params)
                if args.case == "plain":
                    sets = prompt_sets(1 if args.reuse else 3, seqs, (args.prompt_tokens,) * 2, vocab, gen)
                    lines = [("", measure_plain(run, sets * 3 if args.reuse else sets, args.new_tokens, device))]
                else:
                    sets = prompt_sets(4, seqs, SEARCH_R1["prompt"], vocab, gen)
                    t1, t2 = measure_search_r1(run, sets, gen, vocab, device)
                    lines = [(" turn=1", t1), (" turn=2", t2)]
            except Exception as e:  # one engine failing on a new device still lets the others report
                traceback.print_exc()
                print(f"static_engine_bench engine={engine_name} arch={args.arch} seqs={seqs} error={e!r:.200}")
                failed.append(engine_name)
                continue
            finally:
                run = None  # free the engine's cache and graphs before the next one
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows = min(seqs, args.max_batch_size)
            for turn, m in lines:
                prefill, decode, total = m.rates()
                new = args.new_tokens if args.case == "plain" else SEARCH_R1["turn_tokens"]
                print(
                    f"static_engine_bench engine={engine_name} arch={args.arch} case={args.case}{turn} seqs={seqs} "
                    f"max_batch={args.max_batch_size} prompt_tokens={m.prompt_tokens / m.seqs:.0f} new_tokens={new} "
                    f"prefill_tok_s={prefill:.0f} decode_tok_s={_fmt(decode)} tok_s={total:.0f} "
                    f"first_s={m.first_s:.2f} roofline={_fmt(roofline(model, m, rows, bandwidth), 3)} "
                    f"reused_tokens={m.reused_tokens} {common}",
                    flush=True,
                )
    if failed:
        sys.exit(f"static_engine_bench: failed engines: {', '.join(failed)}")


if __name__ == "__main__":
    main()
