"""The one-command GPU check: GRPO through ``main_ppo`` on one GPU, then the checks a first GPU run must pass.

What runs: ``main_ppo`` GRPO steps with FSDP2 on NCCL (one rank, in this process: ``trainer.use_ray=false``; with
``--ray`` in a Ray actor holding the GPU, as a user starts it: ``trainer.use_ray=true``), bf16 compute over fp32 master
weights, the rollout engine ``rollout.engine=auto`` picks (the check names none: vLLM where it is installed, else the
static engine with CUDA-graph decoding on a GPU, as on a bare machine, and the HF engine with ``--device cpu``), a model
of a real architecture with random weights (no weights need to be on the machine) and the BM25 retriever server.
Then:

1. **weights changed**: the last checkpoint against the initial weights (a fraction of the elements);
2. **resume**: ``main_ppo`` again with one more step resumes from that checkpoint (its history continues at the
   next step and does not redo the first);
3. **tied-embedding sync**: the checkpoint loaded into an FSDP2-sharded policy, its gathered state dict synced into
   an HF engine built from the *initial* weights: the engine's head is still its embedding, equal to the policy's
   (in the engine's dtype), and the two models' logits agree;
4. **logprob**: every step's mean |engine - trainer| log-prob (the actor recomputes the old log-probs) within a bound
   derived from bf16 rounding, ``2 * 2^-8 * sqrt(layers)`` times the RMS of the model's logits (0.047 at 36 layers for
   an RMS of 1; ``1e-4`` times it in float32);
5. **graph_replay**: the static engine on the initial weights, greedy, with its decode steps replayed from CUDA
   graphs against the same steps run eagerly: the same tokens, its replay checks within their bound, no fallback;
6. **gpu_tests**: ``python -m pytest -m gpu`` over the test files carrying the marker; all must pass;
7. with ``--levers``, **levers**: each lever's loss and gradient norm against the levers off, and each row's update
   against AdamW's first step for its gradient.

The bounds and why they hold are in ``bench/gpu_gates.py``. Each check prints ``check <name> ok <what it saw>`` or
``check <name> FAILED <why>``; the checks after a failed one still run (those that need its result are left out),
and the script then exits non-zero naming every failed check. Then a table per step, a phase table (generate,
old/reference log-prob passes, update, weight sync: mean seconds and share of the step) with the generate share
against its target (at most 40% of the step; a target, not a check), the generation rate and, where the actor
recomputes the old log-probs (an engine in bf16), the engine's mean |difference| from them; the last line reads
``gpu_check ok device=... use_ray=... step_s=... gen_tok_s=... gen_share=... update_tok_s=... mfu=... peak_gb=...
changed=... logprob_diff=... logprob_bound=...``.

``--arch``: ``smollm2-135m`` (default), ``qwen2.5-0.5b``, ``qwen2.5-3b`` (full fine-tuning), ``qwen2.5-7b`` (LoRA
rank 32 by default; no resume check: a second 30 GB checkpoint would not fit the disk). ``--levers`` then runs one
update and its log-prob passes with and without the speed levers on one batch and prints seconds, update tokens/s,
loss and gradient norm of each (``bench/update_levers.py``), and checks them (7. above).

On a bare CUDA machine (Python 3.12 with torch, transformers, peft, safetensors, pandas, pyarrow, httpx; no network,
no Hydra, FastAPI or FAISS), carry the repository and what ``make gpu-wheels`` gathered into ``.whl/`` (~8 MB), and::

    python3 bench/gpu_check.py --wheels .whl

``--ray`` also needs Ray there: ``make gpu-wheels-ray`` packs its wheel (79 MB) in numbered folders under ``.whl-ray/``
of at most 32 MiB each, one per copy; gather their files in one folder there and pass it as a second ``--wheels``,
which joins the split wheel and checks its sha256 before installing (``bench/gpu_wheels.py``, bench/README.md)::

    python3 bench/gpu_check.py --wheels .whl --wheels /tmp/search-rl-wheels --ray

Rehearsal on CPU (gloo, float32, a smaller batch; what a machine without a GPU can check)::

    python bench/gpu_check.py --device cpu [--ray]
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SITE = Path(tempfile.gettempdir()) / "search-rl-gpu-check-site"

PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peaks from the datasheets (SXM parts)."""

PHASES = ("rollout", "old_log_prob", "ref_log_prob", "update_actor", "sync_weights")

GENERATE_SHARE_TARGET = 0.40
"""The rollout's share of a step to aim for (a target reported beside the phase table, not a check)."""


@dataclass(frozen=True)
class Arch:
    """A model shape: its transformers config class and fields (from the published config.json), and what the check
    changes for it."""

    config_class: str
    fields: dict[str, object]
    overrides: tuple[str, ...] = ()
    """``main_ppo`` overrides this shape needs (LoRA where full fine-tuning with AdamW would not fit one GPU)."""
    resume: bool = True
    """Run the resume check (a second checkpoint, on disk next to the first)."""
    build_dtype: str = "float32"
    """dtype of the random initial weights written to disk (bf16 halves a large model's file and build time)."""

    @property
    def tied(self) -> bool:
        return bool(self.fields.get("tie_word_embeddings"))

    @property
    def layers(self) -> int:
        return int(str(self.fields["num_hidden_layers"]))

    @property
    def lora_rank(self) -> int:
        ranks = [int(o.split("=", 1)[1]) for o in self.overrides if o.startswith("model.lora_rank=")]
        return ranks[-1] if ranks else 0


QWEN25 = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
"""Fields every Qwen2.5 shape shares (the context of the instruct releases)."""

ARCHS: dict[str, Arch] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "smollm2-135m": Arch(
        "LlamaConfig",
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
    "qwen2.5-0.5b": Arch(
        "Qwen2Config",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
            **QWEN25,
        ),
    ),
    # Qwen/Qwen2.5-3B config.json: full fine-tuning (fp32 masters + AdamW ~48 GB)
    "qwen2.5-3b": Arch(
        "Qwen2Config",
        dict(
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
            **QWEN25,
        ),
        build_dtype="bfloat16",
    ),
    # Qwen/Qwen2.5-7B config.json: LoRA (full fine-tuning with AdamW would need ~120 GB or offload); its merged fp32
    # checkpoint is 30 GB, so the resume check (a second one) is left out on a 64 GB disk
    "qwen2.5-7b": Arch(
        "Qwen2Config",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            tie_word_embeddings=False,
            **QWEN25,
        ),
        overrides=("model.lora_rank=32", "model.lora_alpha=64"),
        resume=False,
        build_dtype="bfloat16",
    ),
}


def build_model(arch: str, tokenizer_dir: Path | None, out: Path, device: str) -> tuple[Path, int]:
    """Write a random-weight HF folder of ``arch`` with the tokenizer (SmolLM2's when none is given); returns the
    folder and the parameter count. The weights are drawn on ``device`` (a 7B model's init is slow on CPU)."""
    import torch
    import transformers

    if tokenizer_dir is None:
        from search_rl.models import load_tokenizer

        tokenizer = load_tokenizer("smollm2-135m-instruct")
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    spec = ARCHS[arch]
    config = getattr(transformers, spec.config_class)(
        **spec.fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, spec.build_dtype))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    return out, n_params


def changed_fraction(initial: Path, final: Path) -> float:
    """Fraction of the initial weights' elements that differ in the final checkpoint."""
    from safetensors.torch import load_file

    a, b = load_file(str(initial / "model.safetensors")), load_file(str(final / "model.safetensors"))
    changed = total = 0
    for name, tensor in a.items():
        changed += int((tensor.float() != b[name].float()).sum())
        total += tensor.numel()
    return changed / total


@dataclass
class Run:
    """One check's ``main_ppo`` settings; ``main_ppo`` runs in a child process, as a user starts it."""

    out: Path
    model_dir: Path
    device: str
    prompts: int
    samples: int
    turn_tokens: int
    micro: int
    use_ray: bool
    overrides: list[str]

    @property
    def compute_dtype(self) -> str:
        return "bfloat16" if self.device == "cuda" else "float32"

    @property
    def run_dir(self) -> Path:
        return self.out / "run"

    def checkpoint(self, step: int) -> Path:
        return self.run_dir / f"global_step_{step}" / "actor"

    def main_ppo(self, retriever_url: str, steps: int) -> list[dict[str, float]]:
        """Train up to ``steps`` (resuming from the run folder's latest checkpoint); the run's metric history."""
        overrides = [
            "algorithm=grpo",
            f"model.path={self.model_dir}",
            f"model.dtype={'bfloat16' if self.device == 'cuda' else 'float32'}",
            f"trainer.device={self.device}",
            f"trainer.use_ray={str(self.use_ray).lower()}",
            f"trainer.total_training_steps={steps}",
            "trainer.save_freq=2",
            "trainer.test_freq=0",
            "trainer.logger=[console,jsonl]",
            "trainer.resume=auto",
            f"trainer.default_local_dir={self.run_dir}",
            f"retriever.url={retriever_url}",
            f"data.train_batch_size={self.prompts}",
            f"actor_rollout_ref.rollout.n={self.samples}",
            f"actor_rollout_ref.rollout.max_turn_tokens={self.turn_tokens}",
            "actor_rollout_ref.actor.old_logprobs=recompute",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={self.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={self.micro}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={self.micro}",
            *self.overrides,
        ]
        cmd = [sys.executable, "-m", "search_rl.main_ppo", *overrides]
        print("command:", " ".join(cmd), flush=True)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        subprocess.run(cmd, check=True, env=env, cwd=REPO)
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def check_changed(changed: float, steps: int) -> str:
    """Most of the weights moved in ``steps`` steps (``changed``: the fraction that did; fp32 masters keep even
    lr-1e-6 updates)."""
    from gpu_gates import CheckFailed

    if not changed > 0.5:
        raise CheckFailed(f"only {changed:.4f} of the elements moved in {steps} steps")
    return f"{changed:.4f} of the elements moved in {steps} steps"


def check_resume(before: list[dict[str, float]], after: list[dict[str, float]], steps: int) -> str:
    """The second run continued the first: its history is the first's plus step ``steps + 1``, nothing redone."""
    from gpu_gates import CheckFailed

    seen = [int(m["step"]) for m in after]
    if seen != [*range(1, steps + 2)] or after[:steps] != before:
        raise CheckFailed(f"expected steps 1..{steps + 1} with the first {steps} kept, got {seen}")
    return f"resumed at step {steps + 1}, steps 1..{steps} kept"


def check_tied_sync(run: Run, step: int) -> str:
    """Sync the step-``step`` checkpoint from an FSDP2-sharded policy into an HF engine of the initial weights; the
    largest logit difference between the two. Fails when the engine's head is not its (synced) embedding."""
    import torch
    from gpu_gates import CheckFailed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from search_rl.models import dtype_of
    from search_rl.rollout.engines.hf import HFEngine
    from search_rl.workers import WorkerSpec
    from search_rl.workers import distributed as D

    gpu = run.device == "cuda"
    compute = dtype_of("bfloat16" if gpu else "float32")
    spec = WorkerSpec(rank=0, world_size=1, device=run.device)
    D.setup_worker_process(spec)
    D.init_process_group(spec, "127.0.0.1", 0)
    device = spec.torch_device
    policy = AutoModelForCausalLM.from_pretrained(run.checkpoint(step), dtype=torch.float32).to(device)
    policy = D.shard(policy, spec, compute)
    state = D.full_state_dict(policy)
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir, local_files_only=True)
    engine_model = AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=compute).to(device)
    engine = HFEngine(engine_model, tokenizer)
    engine.update_weights(state.items(), version=step)
    head, embed = engine_model.lm_head.weight, engine_model.model.embed_tokens.weight
    if head is not embed:
        raise CheckFailed("the engine's lm_head is no longer its embedding")
    if not torch.equal(embed, state["model.embed_tokens.weight"].to(device, compute)):
        raise CheckFailed("the engine's embedding is not the policy's")
    ids = torch.tensor([tokenizer.encode("Who wrote Hamlet?")], device=device)
    with torch.no_grad():
        diff = (engine_model(input_ids=ids).logits.float() - policy(input_ids=ids).logits.float()).abs().max().item()
    tolerance = 5e-2 if gpu else 1e-4  # both bf16 forwards on GPU; float32 on CPU
    torch.distributed.destroy_process_group()
    if not diff <= tolerance:
        raise CheckFailed(f"logits differ by {diff:.3g} (> {tolerance})")
    return f"engine head is its embedding, equal to the policy's; logits max |diff| {diff:.3g}"


def install_wheels(folders: list[Path]) -> None:
    """Install the carried wheels (split ones joined first) into a private folder and re-run this script with it on
    the path."""
    from gpu_wheels import install

    t0 = time.perf_counter()
    try:
        n = install(folders, SITE)
    except ValueError as e:
        sys.exit(f"gpu_check: {e}")
    if not n:
        sys.exit(f"gpu_check: no wheels in {', '.join(map(str, folders))} (make gpu-wheels writes them)")
    print(f"installed {n} wheels in {time.perf_counter() - t0:.1f}s", flush=True)
    path = os.pathsep.join(p for p in (str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    argv = [a for i, a in enumerate(sys.argv) if a != "--wheels" and (i == 0 or sys.argv[i - 1] != "--wheels")]
    tokenizer = next((f / "tokenizer" for f in folders if (f / "tokenizer").is_dir()), None)
    if "--tokenizer" not in argv and tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    os.execve(sys.executable, [sys.executable, *argv], {**os.environ, "PYTHONPATH": path})


def phase_table(history: list[dict[str, float]]) -> float:
    """Mean seconds of each phase over the steps after the first (all steps when there is one) and its share of the
    step, then the generation rate; returns the rollout's share."""
    steps = history[1:] or history
    step_s = statistics.mean(m["timing/step_s"] for m in steps)
    print(f"phase (mean of steps {int(steps[0]['step'])}-{int(steps[-1]['step'])}) | s | share of step")
    accounted = 0.0
    for phase in PHASES:
        seconds = statistics.mean(m.get(f"timing/{phase}_s", 0.0) for m in steps)
        accounted += seconds
        print(f"{phase} | {seconds:.2f} | {seconds / step_s:.1%}")
    print(f"other | {step_s - accounted:.2f} | {(step_s - accounted) / step_s:.1%}")
    print(f"step | {step_s:.2f} | 100.0%")
    share = statistics.mean(m.get("timing/rollout_s", 0.0) for m in steps) / step_s
    verdict = "met" if share <= GENERATE_SHARE_TARGET else "missed"
    print(f"target: generate share {share:.1%} of the step (at most {GENERATE_SHARE_TARGET:.0%}: {verdict})")
    gen = statistics.mean(m["rollout/gen_tokens_per_s"] for m in steps)
    print(f"generation: {gen:.0f} tok/s")
    diffs = [m["rollout/logprob_abs_diff"] for m in steps if "rollout/logprob_abs_diff" in m]
    if diffs:  # the actor recomputed the old log-probs (an engine that computes unlike the trainer)
        tis = [m["actor/tis_weight_mean"] for m in steps if "actor/tis_weight_mean" in m]
        print(
            f"engine vs trainer log-probs: mean |diff| {statistics.mean(diffs):.3g}"
            + (f", TIS weight mean {statistics.mean(tis):.4f}" if tis else ", TIS off")
        )
    return share


def step_table(history: list[dict[str, float]], n_params: int, peak: float | None, lora: bool) -> list[float]:
    """One row per step; returns each step's MFU (``6N`` FLOPs per token, ``4N`` with LoRA: no weight gradients)."""
    flops_per_token = (4 if lora else 6) * n_params
    print("step | " + " | ".join(f"{p}_s" for p in PHASES) + " | step_s | gen tok/s | update tok/s | MFU | peak GB")
    mfus = []
    for m in history:
        update_tps = m["perf/actor_update_tokens"] / m["timing/update_actor_s"]
        mfus.append(flops_per_token * update_tps / (peak * 1e12) if peak else float("nan"))
        cells = [f"{m.get(f'timing/{p}_s', 0.0):.2f}" for p in PHASES]
        print(
            f"{m['step']} | " + " | ".join(cells) + f" | {m['timing/step_s']:.2f} | {m['rollout/gen_tokens_per_s']:.0f}"
            f" | {update_tps:.0f} | {mfus[-1]:.3f} | {m.get('perf/max_memory_allocated_gb', float('nan')):.2f}"
        )
    return mfus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, action="append", help="install this folder's wheels first (repeatable)")
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cuda: NCCL, bf16, the static engine; cpu: gloo, fp32, the HF engine (vLLM instead where installed)",
    )
    ap.add_argument("--ray", action="store_true", help="main_ppo with trainer.use_ray=true (make gpu-wheels-ray)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="a saved tokenizer folder (default: SmolLM2's)")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (cuda 16, cpu 2)")
    ap.add_argument("--samples", type=int, default=None, help="samples per prompt (cuda 4, cpu 2)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="most tokens per turn (cuda 256, cpu 16)")
    ap.add_argument("--micro", type=int, default=None, help="samples per forward pass (cuda 16, cpu 4)")
    ap.add_argument("--levers", action="store_true", help="then one update with and without the speed levers")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="extra Hydra overrides (repeatable), e.g. actor_rollout_ref.rollout.engine=hf",
    )
    args = ap.parse_args()
    if args.wheels:
        install_wheels(args.wheels)  # does not return
    if args.ray:
        from gpu_wheels import unmet_requirements

        if unmet := unmet_requirements("ray"):
            sys.exit(f"gpu_check: --ray needs Ray and its requirements; unmet: {', '.join(unmet)}")
    sys.path.insert(0, str(REPO))
    gpu = args.device == "cuda"
    import torch

    if gpu and not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda but torch sees no CUDA device (rehearse with --device cpu)")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    shutil.rmtree(out / "run", ignore_errors=True)
    t_start = time.perf_counter()
    arch = ARCHS[args.arch]
    build_device = args.device if arch.build_dtype != "float32" else "cpu"
    model_dir, n_params = build_model(args.arch, args.tokenizer, out / "model", build_device)
    run = Run(
        out=out,
        model_dir=model_dir,
        device=args.device,
        prompts=args.prompts or (16 if gpu else 2),
        samples=args.samples or (4 if gpu else 2),
        turn_tokens=args.turn_tokens or (256 if gpu else 16),
        micro=args.micro or (16 if gpu else 4),
        use_ray=args.ray,
        overrides=[*arch.overrides, *args.override],
    )
    from gpu_gates import logprob_bound

    checks, history, changed, scale = run_checks(args, arch, run)
    name = torch.cuda.get_device_name() if gpu else "cpu"
    mfu, share = report(history, args, arch, name, n_params) if history else (float("nan"), float("nan"))
    checks.exit_if_failed()
    last = history[-1]
    steps = [m["timing/step_s"] for m in history]
    update_tps = last["perf/actor_update_tokens"] / last["timing/update_actor_s"]
    print(
        f"gpu_check ok device={name.replace(' ', '_')} arch={args.arch} use_ray={str(args.ray).lower()}"
        f" step_s={statistics.mean(steps[1:] or steps):.2f}"
        f" gen_tok_s={last['rollout/gen_tokens_per_s']:.0f} gen_share={share:.3f}"
        f" update_tok_s={update_tps:.0f} mfu={mfu:.3f}"
        f" peak_gb={last.get('perf/max_memory_allocated_gb', float('nan')):.2f}"
        f" changed={changed:.4f}"
        f" logprob_diff={last.get('rollout/logprob_abs_diff', float('nan')):.3g}"
        f" logprob_bound={logprob_bound(run.compute_dtype, arch.layers, scale):.3g}"
        f" total_s={time.perf_counter() - t_start:.0f}"
    )


def report(
    history: list[dict[str, float]], args: argparse.Namespace, arch: Arch, name: str, n_params: int
) -> tuple[float, float]:
    """The step and phase tables of the training run; returns the last step's MFU and the generate share."""
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    dtype = ("bf16 compute, fp32 master" if args.device == "cuda" else "fp32") + (
        "; workers in Ray actors" if args.ray else ""
    )
    lora = f", LoRA rank {arch.lora_rank}" if arch.lora_rank else ""
    print(f"\n{name}; {args.arch} ({n_params / 1e6:.1f}M parameters, random weights{lora}); {dtype}")
    mfus = step_table(history, n_params, peak, bool(arch.lora_rank))
    return mfus[-1], phase_table(history)


def run_checks(args: argparse.Namespace, arch: Arch, run: Run) -> tuple[Any, list[dict[str, float]], float, float]:
    """Train, then every check of the module docstring; returns the checks' record, the run's metric history, the
    fraction of the weights that changed and the RMS of the initial model's logits (nan if not measured)."""
    from gpu_gates import Checks, check_gpu_tests, check_graph_replay, check_levers, check_logprobs, logit_rms

    from retriever_server.launcher import RetrieverProcess, bm25_env

    checks = Checks()
    history: list[dict[str, float]] = []
    changed = scale = float("nan")

    def weights_changed() -> str:
        nonlocal changed
        changed = changed_fraction(run.model_dir, run.checkpoint(args.steps))
        return check_changed(changed, args.steps)

    with RetrieverProcess(env=bm25_env(run.out / "index"), log_path=run.out / "retriever.log") as retriever:

        def train() -> str:
            history.extend(run.main_ppo(retriever.url, steps=args.steps))
            return f"main_ppo ran {len(history)} steps"

        trained = checks.run("train", train)
        if trained:
            checks.run("weights_changed", weights_changed)
            if arch.resume:
                checks.run(
                    "resume",
                    lambda: check_resume(history, run.main_ppo(retriever.url, steps=args.steps + 1), args.steps),
                )
            else:
                print("check resume left out for this shape (a second checkpoint would not fit the disk)")

            def logprob() -> str:
                nonlocal scale
                scale = logit_rms(run.model_dir, run.device, run.compute_dtype)  # the weights the steps started from
                return check_logprobs(history, run.compute_dtype, arch.layers, scale)

            checks.run("logprob", logprob)
    if trained and arch.tied:
        checks.run("tied_sync", lambda: check_tied_sync(run, args.steps))
    checks.run("graph_replay", lambda: check_graph_replay(run.model_dir, run.device))
    if args.levers:
        from update_levers import compare_levers, print_rows

        def levers() -> str:
            rows = compare_levers(
                run.model_dir,
                run.device,
                prompts=run.prompts,
                samples=run.samples,
                turn_tokens=run.turn_tokens,
                micro=run.micro,
                lora_rank=arch.lora_rank,
            )
            print_rows(rows)
            return check_levers(rows, run.compute_dtype)

        checks.run("levers", levers)
    checks.run("gpu_tests", lambda: check_gpu_tests(REPO, run.device))
    return checks, history, changed, scale


if __name__ == "__main__":
    main()
