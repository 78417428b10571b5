"""Rollout throughput: a multi-turn search rollout vs plain ``model.generate`` producing the same number of tokens.

The rollout is ``LLMGenerationManager`` with the HF engine (``--engine static``: the static one) over the first
``--n`` shipped test questions against a running retriever; its tokens/s counts only model-generated tokens (mask 1)
over the rollout's wall time, which includes every turn's prefill, the stop checks and the retriever calls. The limit
is one batched HF ``generate`` call on the same prompts, forced to produce the same number of tokens per sample
(min = max new tokens) at the same temperature. Tokens generated after a stop string or EOS are counted
independently from the engine's outputs by decoding each result's growing prefix (must be 0).

Wall-clock figures depend on whatever else runs on the machine; the process-CPU-time ratio printed next to them
does not (exactly so with ``--threads 1``, where no thread spins waiting for another).

    python bench/rollout_bench.py --retriever-url http://127.0.0.1:8000
    python bench/rollout_bench.py --retriever-url URL --dump docs/trajectories.md   # also write readable rollouts

Last line: ``rollout_bench ratio=<x> tokens_after_stop=<n>``.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import pandas as pd
import torch

from search_rl.config import (
    EngineRolloutConfig,
    HFEngineConfig,
    RetrieverClientConfig,
    RolloutConfig,
    StaticEngineConfig,
)
from search_rl.datatypes import Generated, GroundTruth, RolloutResult, SamplingParams
from search_rl.logging_setup import configure_logging
from search_rl.models import SMOLLM2, load_model, load_tokenizer
from search_rl.prompt_data import encode_prompt
from search_rl.reward import compute_reward
from search_rl.rollout.assembly import build_rollout
from search_rl.rollout.backends import RetrieverClient
from search_rl.tags import STOP_STRINGS

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets" / "nq_hotpotqa_mini" / "test.parquet"


def engine_settings(name: str, model, prefix_cache: bool) -> EngineRolloutConfig:  # type: ignore[no-untyped-def]
    """The engine ``--engine`` names: the HF engine, or the static one with CUDA graphs and compile asked for on CUDA
    only (left null they stay off until the engine passes the GPU round)."""
    on_cuda = model.device.type == "cuda"
    static = StaticEngineConfig(cuda_graphs=on_cuda, compile=on_cuda)
    return EngineRolloutConfig(engine=name, hf=HFEngineConfig(prefix_cache=prefix_cache), static=static)


def keep_results(engine) -> None:  # type: ignore[no-untyped-def]
    """Keep every result of ``engine`` (of ``generate`` calls and of the HF engine's sessions) in ``engine.results``,
    to count tokens after stops independently of the manager."""
    engine.results = []
    generate = engine.generate

    def counted_generate(prompts, params, max_new_tokens=None):  # type: ignore[no-untyped-def]
        out = generate(prompts, params, max_new_tokens)
        engine.results.extend(out)
        return out

    engine.generate = counted_generate
    if not hasattr(engine, "open_session"):  # the static engine has no sessions
        return
    open_session = engine.open_session

    def counted_session(params):  # type: ignore[no-untyped-def]
        session = open_session(params)
        step = session.step

        def counted_step():  # type: ignore[no-untyped-def]
            done = step()
            engine.results.extend(g for _, g in done)
            return done

        session.step = counted_step
        return session

    engine.open_session = counted_session


def tokens_after_stop(tokenizer, results: list[Generated], eos: tuple[int, ...]) -> int:
    """Tokens that follow the first completed stop string or EOS in each result."""
    extra = 0
    for g in results:
        ids = list(g.token_ids)
        for k in range(1, len(ids) + 1):
            if ids[k - 1] in eos or any(s in tokenizer.decode(ids[:k]) for s in STOP_STRINGS):
                extra += len(ids) - k
                break
    return extra


def plain_generate(
    model, tokenizer, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int, greedy: bool
) -> tuple[float, float]:
    """(wall, process CPU) seconds of one batched HF ``generate`` making exactly ``new_tokens`` per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            **(
                {"do_sample": False}
                if greedy
                else {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            ),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] - width == new_tokens
    return elapsed, cpu


def dump(path: Path, tokenizer, rows: pd.DataFrame, result: RolloutResult, k: int) -> None:
    """Write ``k`` trajectories as Markdown (question, gold, every segment with its mask, the reward): those that
    searched first, then those that answered, then the rest, each group in input order."""
    trajs = result.trajectories
    order = sorted(range(len(trajs)), key=lambda i: (-min(trajs[i].num_searches, 1), trajs[i].final_answer is None, i))
    lines = [f"Selected samples (of {len(trajs)}, searched first, then answered): {sorted(order[:k])}", ""]
    for i in order[:k]:
        traj = trajs[i]
        row = rows.iloc[i]
        gold = tuple(row.reward_model["ground_truth"]["target"])
        reward = compute_reward(traj, GroundTruth(gold, row.data_source))
        lines += [
            f"### sample {i}, {row.data_source}: {row.question}",
            "",
            f"gold: {list(gold)}; stop: {traj.stop_reason}; "
            f"searches: {traj.num_searches}; answer: {traj.final_answer!r}; EM reward: {reward.score}",
            "",
        ]
        for seg in traj.segments:
            label = "model (mask 1)" if seg.kind == "model" else "observation (mask 0)"
            lines += [f"{label}, {seg.end - seg.start} tokens:", "```text", seg.text.strip("\n"), "```"]
        lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retriever-url", required=True)
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-turn-tokens", type=int, default=64)
    ap.add_argument("--max-response-tokens", type=int, default=400)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--greedy", action="store_true", help="argmax decoding in both the rollout and the baseline")
    ap.add_argument("--no-prefix-cache", action="store_true", help="re-encode the whole context every turn")
    ap.add_argument(
        "--schedule",
        choices=["continuous", "turns"],
        default=RolloutConfig.schedule,
        help=f"rollout.schedule (default: {RolloutConfig.schedule}, the trainer's)",
    )
    ap.add_argument("--engine", choices=["hf", "static"], default="hf", help="the rollout's engine")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 makes CPU-time figures exact)")
    ap.add_argument("--dump", type=Path, default=None, help="write the first --dump-k trajectories here (Markdown)")
    ap.add_argument("--dump-k", type=int, default=4)
    args = ap.parse_args()
    configure_logging(logging.WARNING)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    rows = pd.read_parquet(DATA).head(args.n)
    prompts = [encode_prompt(tokenizer, list(p)) for p in rows.prompt]
    client = RetrieverClient(RetrieverClientConfig(url=args.retriever_url, topk=3))
    client.check_reachable()
    if args.engine == "static" and args.schedule != "turns":
        ap.error("--engine static runs rollout.schedule=turns only (the static engine has no sessions)")
    cfg = RolloutConfig(
        search_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_obs_tokens=256,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        on_retriever_error="raise",
        schedule=args.schedule,
    )
    settings = engine_settings(args.engine, model, prefix_cache=not args.no_prefix_cache)
    rollout = build_rollout(
        settings,
        cfg,
        tokenizer,
        model=model,
        dtype=model.dtype,
        device=model.device,
        export=None,
        seed=args.seed,
        retriever=client,
    )
    engine, manager = rollout.engine, rollout.manager
    keep_results(engine)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=0))  # warm-up, not timed
    engine.results.clear()

    start, cpu = time.perf_counter(), time.process_time()
    result = manager.generate(prompts, seed=args.seed, greedy=args.greedy)
    rollout_s, rollout_cpu = time.perf_counter() - start, time.process_time() - cpu
    model_tokens = int(sum(int(t.response_mask.sum()) for t in result.trajectories))
    per_sample = max(1, math.ceil(model_tokens / len(prompts)))
    plain_s, plain_cpu = plain_generate(model, tokenizer, prompts, per_sample, args.temperature, args.seed, args.greedy)

    rollout_tps, plain_tps = model_tokens / rollout_s, per_sample * len(prompts) / plain_s
    after = tokens_after_stop(tokenizer, engine.results, engine.eos_token_ids)
    m = result.metrics
    print(
        f"samples={len(prompts)} model_tokens={model_tokens} turns_mean={m['rollout/turns_mean']:.2f} "
        f"searches_mean={m['rollout/searches_mean']:.2f} answer_rate={m['rollout/answer_rate']:.2f}"
    )
    print(
        f"rollout: {rollout_s:.1f}s {rollout_tps:.1f} tok/s (generate {m['timing/generate_s']:.1f}s, "
        f"retrieve {m['timing/retrieve_s']:.2f}s, {len(engine.results)} engine results)"
    )
    print(f"plain generate: {per_sample} tokens x {len(prompts)} in {plain_s:.1f}s = {plain_tps:.1f} tok/s")
    stats = engine.prefix.stats
    print(
        f"process CPU seconds (robust to other load on the machine): rollout {rollout_cpu:.1f}, plain {plain_cpu:.1f}; "
        f"CPU-time ratio {(model_tokens / rollout_cpu) / (per_sample * len(prompts) / plain_cpu):.3f}"
    )
    state = "off" if args.no_prefix_cache else "on"
    print(
        f"prefix cache: {state}, {stats.hits} hits, {stats.reused_tokens} tokens reused ({stats.common_tokens} of "
        f"them a call's common prompt prefix, encoded once), {engine.shared_prompt_tokens} tokens of repeated "
        "prompts encoded once"
    )
    if args.dump is not None:
        dump(args.dump, tokenizer, rows, result, args.dump_k)
    print(f"schedule: {args.schedule} engine: {args.engine}")
    print(f"rollout_bench ratio={rollout_tps / plain_tps:.3f} tokens_after_stop={after}")


if __name__ == "__main__":
    main()
