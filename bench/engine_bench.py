"""Rollout engines compared: the multi-turn search rollout of SmolLM2-135M-Instruct with the HF engine and with vLLM
(the CPU build), same prompts, budgets, sampling and retriever.

Each engine runs ``LLMGenerationManager`` over the first ``--n`` shipped test questions against a running
retriever; tokens/s counts the model-generated tokens (mask 1) over the rollout's wall time (every turn's prefill,
stop checks and retrieval; not the engine's start, which is timed apart). Run it in the vLLM venv (``make
install-vllm``), which also has the HF engine:

    .venv-vllm/bin/python bench/engine_bench.py --retriever-url http://127.0.0.1:8000
    .venv-vllm/bin/python bench/engine_bench.py --retriever-url URL --engines vllm --dtype bfloat16

One line per engine: ``engine_bench engine=<e> dtype=<d> tok_s=<x> model_tokens=<n> rollout_s=<s> start_s=<s>``.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import pandas as pd
import torch

from search_rl.config import EngineRolloutConfig, RetrieverClientConfig, RolloutConfig, VLLMEngineConfig
from search_rl.logging_setup import configure_logging
from search_rl.models import SMOLLM2, dtype_of, load_model, load_tokenizer, model_dir
from search_rl.models.weights import save_hf_folder, tensor_aliases
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.assembly import Rollout, build_rollout
from search_rl.rollout.backends import RetrieverClient

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets" / "nq_hotpotqa_mini" / "test.parquet"


def build(  # type: ignore[no-untyped-def]
    engine: str, dtype: str, tokenizer, cfg: RolloutConfig, client, args: argparse.Namespace, scratch: Path
) -> Rollout:
    """The engine named ``engine`` over SmolLM2 in ``dtype`` (vLLM loads a folder saved in that dtype) and the search
    loop over it."""

    def export(_: str) -> Path:
        if dtype == "float32":
            return model_dir(args.model)
        model = load_model(args.model)
        state, aliases = model.state_dict(), tensor_aliases(model)
        folder = scratch / dtype
        return save_hf_folder(folder, state, model.config, aliases=aliases, tokenizer=tokenizer, dtype=dtype_of(dtype))

    # gpu_memory_utilization: the share VLLMEngine takes when not told (this bench's vLLM runs on CPU)
    settings = EngineRolloutConfig(
        engine=engine, vllm=VLLMEngineConfig(kv_cache_gib=args.kv_cache_gib), gpu_memory_utilization=0.5
    )
    return build_rollout(
        settings,
        cfg,
        tokenizer,
        model=load_model(args.model, dtype=dtype_of(dtype)) if engine == "hf" else None,
        dtype=dtype_of(dtype),
        device=torch.device("cpu"),
        export=export,
        seed=args.seed,
        retriever=client,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retriever-url", required=True)
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-turn-tokens", type=int, default=128)
    ap.add_argument("--max-response-tokens", type=int, default=512)
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/search-rl-engine-bench"))
    args = ap.parse_args()
    configure_logging(logging.WARNING)

    tokenizer = load_tokenizer(args.model)
    rows = pd.read_parquet(DATA).head(args.n)
    prompts = [encode_prompt(tokenizer, list(p)) for p in rows.prompt]
    client = RetrieverClient(RetrieverClientConfig(url=args.retriever_url, topk=3))
    client.check_reachable()
    cfg = RolloutConfig(
        search_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_obs_tokens=256,
        max_response_tokens=args.max_response_tokens,
        temperature=1.0,
    )
    for name in args.engines.split(","):
        start = time.perf_counter()
        rollout = build(name, args.dtype, tokenizer, cfg, client, args, args.scratch)
        start_s = time.perf_counter() - start
        engine, manager = rollout.engine, rollout.manager
        t0 = time.perf_counter()
        with torch.inference_mode():
            result = manager.generate(prompts, seed=args.seed, greedy=False)
        rollout_s = time.perf_counter() - t0
        tokens = int(sum(int(t.response_mask.sum()) for t in result.trajectories))
        m = result.metrics
        print(
            f"engine_bench engine={name} dtype={args.dtype} tok_s={tokens / rollout_s:.1f} model_tokens={tokens} "
            f"rollout_s={rollout_s:.1f} start_s={start_s:.1f} searches_mean={m['rollout/searches_mean']:.2f} "
            f"answer_rate={m['rollout/answer_rate']:.2f}",
            flush=True,
        )
        del rollout, engine, manager


if __name__ == "__main__":
    main()
