"""The rollout/trainer mismatch of each engine in GRPO training, and what truncated importance sampling (TIS) does
about it: SmolLM2-135M-Instruct, ``main_ppo`` with the engine's sampling log-probs compared with the actor's
recomputed ones every step, against a BM25 server started here.

Per engine: mean |engine - trainer| log-prob over response tokens (``rollout/logprob_abs_diff``), the mean TIS
weight and the share of tokens at the cap (``actor/tis_*``, when TIS is on: the default for vLLM), rollout seconds
per step and generated tokens/s. Run it in the vLLM venv (``make install-vllm``), which also has the HF engine::

    .venv-vllm/bin/python bench/engine_mismatch_bench.py --engines hf,vllm --steps 4

One line per engine: ``engine_mismatch engine=<e> dtype=<d> logprob_abs_diff=<x> tis_weight=<w> tis_capped=<f>
rollout_s=<s> gen_tok_s=<t>`` (means over the steps after the first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from retriever_server.launcher import RetrieverProcess, bm25_env

REPO = Path(__file__).resolve().parent.parent


def run(engine: str, args: argparse.Namespace, url: str, out: Path) -> list[dict[str, float]]:
    """``main_ppo`` with ``engine`` for ``args.steps`` steps; its metric history."""
    overrides = [
        "algorithm=grpo",
        f"rollout={engine}",
        f"model.dtype={args.dtype}",
        "trainer.use_ray=false",
        "trainer.device=cpu",
        f"trainer.total_training_steps={args.steps}",
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        "trainer.logger=[jsonl]",
        "trainer.resume=disable",
        f"trainer.default_local_dir={out}",
        f"retriever.url={url}",
        f"data.train_batch_size={args.prompts}",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.old_logprobs=recompute",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "max_turns=2",
        *args.override,
    ]
    subprocess.run([sys.executable, "-m", "search_rl.main_ppo", *overrides], check=True, cwd=REPO)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--override", action="append", default=[], help="extra Hydra overrides (repeatable)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="engine_mismatch-"))
    lines = []
    with RetrieverProcess(env=bm25_env(out / "index"), log_path=out / "retriever.log") as retriever:
        for engine in args.engines.split(","):
            history = run(engine, args, retriever.url, out / engine)[1:] or []
            if not history:
                sys.exit("engine_mismatch_bench: needs --steps 2 or more (the first step is a warm-up)")

            def mean(key: str, rows: list[dict[str, float]] = history) -> float:
                values = [m[key] for m in rows if key in m]
                return statistics.mean(values) if values else float("nan")

            lines.append(
                f"engine_mismatch engine={engine} dtype={args.dtype} "
                f"logprob_abs_diff={mean('rollout/logprob_abs_diff'):.3g} "
                f"tis_weight={mean('actor/tis_weight_mean'):.4f} tis_capped={mean('actor/tis_truncated_frac'):.4f} "
                f"rollout_s={mean('timing/rollout_s'):.1f} gen_tok_s={mean('rollout/gen_tokens_per_s'):.1f}"
            )
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
