"""The learning benchmark: does RL on top of the warm start beat the warm start and naive RAG? (docs/learning.md)

Up to seven rows on the same fixed, seeded subset of the shipped test split, the same retriever and the same greedy
decoding, each scored by ``main_eval`` (EM / sub-EM / F1, answer rate, searches per question):

1. base model with the search protocol        5. warm start + GRPO (``main_ppo algorithm=grpo``)
2. base model closed-book                      6. warm start + PPO (``main_ppo algorithm=ppo``, with a critic)
3. base model with naive RAG (top-3 inlined)   7. warm start + rejection sampling (``rft``, only when asked for:
4. after the warm start only (``main_sft``)       sampled training questions -> ``rft_rows`` -> ``main_sft``)

Every phase runs as the user would run it: the exact ``python -m search_rl.main_*`` command lines (written to
``commands.sh``) in subprocesses, logs in the output folder. Results: ``results.json``, ``results.md`` (the table,
seconds per step by phase, example trajectories), and the training curves as PNGs (``plots/``).

    python bench/learning_bench.py --quick                         # a few minutes: tiny budgets, proves the pipeline
    python bench/learning_bench.py                                 # about an hour on 2 CPU cores
    python bench/learning_bench.py --retriever-url http://127.0.0.1:8000/retrieve --out runs/learning_bench
    python bench/learning_bench.py --profile long --rows sft,grpo --warm-start runs/ws/sft/global_step_30
    python bench/learning_bench.py --profile recipe --rows naive_rag,sft,grpo   # the docs' 384-token recipe
    python bench/learning_bench.py --profile recipe --rows sft,rft --warm-start runs/sft/global_step_12
    python bench/learning_bench.py --profile recipe --rows sft,rft --warm-start-rows runs/bare/sft_train.parquet

Without ``--retriever-url`` it starts the default dense retriever (``uvicorn retriever_server.app:app``) itself.
Last line: ``learning_bench base=<em> rag=<em> sft=<em> grpo=<em> ppo=<em> rft=<em>`` (EM over the evaluated
questions, of the rows run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Budget:
    """How much of everything one benchmark run spends."""

    eval_questions: int
    sft_steps: int
    sft_batch: int
    rl_steps: int
    rl_prompts: int
    group_size: int
    max_turns: int = 2
    max_turn_tokens: int = 128
    max_obs_tokens: int = 256
    val_every: int = 0
    """Validate the RL run every this many steps (and before it) on ``val_questions`` of the shipped validation split
    (a slice of train), keep those checkpoints and score the best one on test; 0 = score the last step."""
    val_questions: int = 100
    sft_overrides: tuple[str, ...] = ()
    """``main_sft`` overrides the profile itself sets (before ``--sft-override``)."""
    rl_overrides: tuple[str, ...] = ()
    """``main_ppo`` overrides the profile itself sets (after ``RL_DEFAULTS``, before ``--rl-override``)."""
    rft_questions: int = 512
    """Row ``rft``: the first this many training questions (``main_eval``'s seeded order) are sampled ..."""
    rft_samples: int = 4
    """... this many times each at temperature 1.0; ``rft_rows`` keeps the exactly right trajectories without a
    ``<think>`` turn, ..."""
    rft_max_per_question: int = 2
    """... at most this many per question, mixed one for one with rows of the shipped warm-start file; ..."""
    rft_steps: int = 16
    """... ``main_sft`` trains the warm start on them this many steps of ``sft_batch`` rows (``RFT_DEFAULTS``), ..."""
    rft_val_every: int = 4
    """... validated before training and every this many steps; the best validated step is scored on test."""


FULL = Budget(eval_questions=100, sft_steps=30, sft_batch=8, rl_steps=6, rl_prompts=4, group_size=4)
QUICK = Budget(
    eval_questions=8,
    sft_steps=4,
    sft_batch=4,
    rl_steps=1,
    rl_prompts=2,
    group_size=2,
    val_questions=8,
    rft_questions=8,
    rft_samples=2,
    rft_steps=2,
    rft_val_every=1,
)
LONG = Budget(eval_questions=300, sft_steps=30, sft_batch=8, rl_steps=40, rl_prompts=4, group_size=4, val_every=5)
"""``--profile long``: 300 test questions (enough for a paired test to see 10 EM points), 40 RL steps, the step
chosen on 100 validation questions every 5 steps."""
RECIPE = Budget(
    eval_questions=300,
    sft_steps=12,
    sft_batch=8,
    rl_steps=24,
    rl_prompts=4,
    group_size=4,
    max_turn_tokens=64,
    max_obs_tokens=384,
    val_every=3,
    sft_overrides=("actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.optim.lr_warmup_steps=2"),
    rl_overrides=("model.lora_rank=16", "model.lora_alpha=32", "actor_rollout_ref.actor.optim.lr=1e-4"),
)
"""``--profile recipe``: docs/learning.md's recipe at the trainer's 384-token observations: a 12-step warm start at
lr 1e-4, then 24 GRPO steps with LoRA adapters (rank 16, lr 1e-4), the step chosen on 100 validation questions every
3 steps, 300 test questions, 64-token turns."""
PROFILES = {"full": FULL, "quick": QUICK, "long": LONG, "recipe": RECIPE}


def merge_overrides(*groups: Sequence[str]) -> list[str]:
    """Hydra overrides from ``groups`` in order, one per key: a later ``key=value`` replaces an earlier one in its
    place, so the command written to ``commands.sh`` shows each setting once, with the value in force."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override.partition("=")[0]] = override
    return list(merged.values())


RL_DEFAULTS = (
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "reward.partial_credit=f1",
    "reward.partial_credit_weight=0.5",
)
"""RL settings of the benchmark (before ``--rl-override``): a learning rate a 135M model moves at in a few steps,
and F1 partial credit so that groups of wrong answers still differ (docs/learning.md says why)."""

RFT_DEFAULTS = ("actor_rollout_ref.actor.optim.lr=2e-5", "actor_rollout_ref.actor.optim.lr_warmup_steps=2")
"""``main_sft`` settings of the rejection-sampling row (before ``--rft-override``): the measured rounds' low learning
rate; the warm start's would overfit a few hundred rows (docs/training.md)."""

TRAIN_FILE = "data/datasets/nq_hotpotqa_mini/train.parquet"
WARM_START_FILE = "data/datasets/nq_hotpotqa_mini/sft_train.parquet"

ROWS = (
    ("base", "base model, search protocol"),
    ("closed_book", "base model, closed-book"),
    ("naive_rag", "base model, naive RAG (top-3 inlined)"),
    ("sft", "warm start (SFT) only"),
    ("grpo", "warm start + GRPO"),
    ("ppo", "warm start + PPO"),
    ("rft", "warm start + rejection sampling"),
)


@dataclass
class Bench:
    """The run: output folder, retriever, budgets, and what has been recorded so far."""

    out: Path
    url: str
    budget: Budget
    sft_overrides: list[str] = field(default_factory=list)
    rl_overrides: list[str] = field(default_factory=list)
    rft_overrides: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    warm_start: Path | None = None
    warm_start_rows: str = WARM_START_FILE
    """The warm start's trajectories: the ``sft`` row trains on them and the ``rft`` row mixes them in."""
    chosen: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per RL row chosen on validation: ``{"step", "val_em": {step: em}}``."""

    def shared(self) -> list[str]:
        """Overrides every trainer and evaluation run shares: the same retriever, search loop and budgets for all
        rows (``actor_rollout_ref.rollout`` in every entry point)."""
        b = self.budget
        return [
            f"retriever.url={self.url}",
            f"max_turns={b.max_turns}",
            f"actor_rollout_ref.rollout.max_turn_tokens={b.max_turn_tokens}",
            f"actor_rollout_ref.rollout.max_obs_tokens={b.max_obs_tokens}",
        ]

    def run(self, name: str, module: str, overrides: list[str]) -> None:
        """Run ``python -m <module> <overrides>`` from the repository root, log to ``<out>/logs/<name>.log``."""
        argv = [sys.executable, "-m", module, *overrides]
        self.commands.append(f"python -m {module} " + " ".join(shlex.quote(o) for o in overrides))
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        log = self.out / "logs" / f"{name}.log"
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {self.commands[-1]}", flush=True)
        start = time.perf_counter()
        with log.open("w") as f:
            proc = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False)
        self.seconds[name] = time.perf_counter() - start
        if proc.returncode != 0:
            tail = "\n".join(log.read_text().splitlines()[-25:])
            raise SystemExit(f"{name} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
        print(f"[{time.strftime('%H:%M:%S')}] {name}: done in {self.seconds[name]:.0f} s", flush=True)

    def evaluate(self, row: str, model: str, baseline: str) -> None:
        """Greedy ``main_eval`` of ``model`` with ``baseline`` on the benchmark's questions; records the metrics."""
        b = self.budget
        folder = self.out / "eval" / row
        self.run(
            f"eval_{row}",
            "search_rl.main_eval",
            [
                f"model.path={model}",
                f"baseline={baseline}",
                f"data.max_samples={b.eval_questions}",
                f"output_dir={folder}",
                *self.shared(),
            ],
        )
        (metrics_file,) = sorted(folder.glob("*/metrics.json"))[-1:]
        self.results[row] = json.loads(metrics_file.read_text())

    def train_sft(self) -> Path:
        if self.warm_start is not None:  # a finished warm start (same budgets) is reused, not trained again
            return self.warm_start
        run_dir = self.out / "sft"
        self.run("sft", "search_rl.main_sft", self.sft_command(run_dir))
        return run_dir / f"global_step_{self.budget.sft_steps}"

    def sft_command(self, run_dir: Path) -> list[str]:
        """The ``main_sft`` overrides of the warm start."""
        b = self.budget
        return merge_overrides(
            [
                f"trainer.default_local_dir={run_dir}",
                f"trainer.total_training_steps={b.sft_steps}",
                f"trainer.save_freq={b.sft_steps}",
                "trainer.test_freq=0",
                "trainer.resume=disable",
                "trainer.logger=[console,jsonl]",
                f"data.train_files=[{self.warm_start_rows}]",
                f"data.train_batch_size={b.sft_batch}",
                *self.shared(),
            ],
            b.sft_overrides,
            self.sft_overrides,
        )

    def train_rl(self, algorithm: str, start: Path) -> Path:
        b = self.budget
        run_dir = self.out / algorithm
        self.run(algorithm, "search_rl.main_ppo", self.rl_command(algorithm, start, run_dir))
        if b.val_every <= 0:
            return run_dir / f"global_step_{b.rl_steps}"
        return self.choose(algorithm, run_dir)

    def choose(self, row: str, run_dir: Path) -> Path:
        """The checkpoint of ``run_dir`` with the best validation EM (``search_rl.tools.best_checkpoint``)."""
        from search_rl.tools.best_checkpoint import choose_step, saved_steps, validation_scores

        scores = validation_scores(run_dir)
        step = choose_step(scores, saved_steps(run_dir))
        self.chosen[row] = {"step": step, "val_em": scores}
        print(f"[{time.strftime('%H:%M:%S')}] {row}: step {step} chosen on validation EM {scores}", flush=True)
        return run_dir / f"global_step_{step}"

    def train_rft(self, start: Path) -> Path:
        """Rejection-sampling row: sample training questions from ``start``, keep the right trajectories
        (``rft_rows``, passages looked up in the shipped corpus: the retriever must serve it), fine-tune ``start`` on
        them; the checkpoint chosen on validation."""
        data = self.out / "rft_data"
        b = self.budget
        reused = finished_samples(data / "samples", start, b.rft_questions, b.rft_samples)
        if reused is None:
            self.run("rft_samples", "search_rl.main_eval", self.rft_sample_command(start, data / "samples"))
        else:  # an earlier run of this folder sampled them (a later phase failed): ~30 min not spent again
            print(f"[{time.strftime('%H:%M:%S')}] rft_samples: reusing the finished samples in {reused}", flush=True)
        self.run("rft_rows", "search_rl.tools.rft_rows", self.rft_rows_command(data))
        run_dir = self.out / "rft"
        self.run("rft", "search_rl.main_sft", self.rft_sft_command(start, data / "rows.parquet", run_dir))
        return self.choose("rft", run_dir)

    def rft_sample_command(self, start: Path, folder: Path) -> list[str]:
        """The ``main_eval`` overrides that sample the training questions."""
        b = self.budget
        return [
            f"model.path={start}",
            f"n_samples={b.rft_samples}",
            "actor_rollout_ref.rollout.temperature=1.0",
            f"data.files=[{TRAIN_FILE}]",
            f"data.max_samples={b.rft_questions}",
            f"output_dir={folder}",
            *self.shared(),
        ]

    def rft_rows_command(self, data: Path) -> list[str]:
        """The ``rft_rows`` arguments that turn the samples into SFT rows (``data/rows.parquet``)."""
        return [
            "--records",
            str(data / "samples"),
            "--questions",
            TRAIN_FILE,
            "--max-per-question",
            str(self.budget.rft_max_per_question),
            "--without-think",
            "--min-rows",
            str(self.budget.sft_batch),
            "--mix",
            self.warm_start_rows,
            "--output",
            str(data / "rows.parquet"),
        ]

    def rft_sft_command(self, start: Path, rows: Path, run_dir: Path) -> list[str]:
        """The ``main_sft`` overrides that train ``start`` on the kept rows, validating every ``rft_val_every``."""
        b = self.budget
        return merge_overrides(
            [
                f"model.path={start}",
                f"data.train_files=[{rows}]",
                f"trainer.default_local_dir={run_dir}",
                f"trainer.total_training_steps={b.rft_steps}",
                f"trainer.save_freq={b.rft_val_every}",
                f"trainer.test_freq={b.rft_val_every}",
                "trainer.val_before_train=true",
                f"trainer.max_ckpt_to_keep={-(-b.rft_steps // b.rft_val_every) + 1}",
                f"data.val_max_samples={b.val_questions}",
                "trainer.resume=disable",
                "trainer.logger=[console,jsonl]",
                f"data.train_batch_size={b.sft_batch}",
                *self.shared(),
            ],
            RFT_DEFAULTS,
            self.rft_overrides,
        )

    def rl_command(self, algorithm: str, start: Path, run_dir: Path) -> list[str]:
        """The ``main_ppo`` overrides of one RL row (``grpo`` or ``ppo``) from the warm start ``start``."""
        b = self.budget
        grpo = algorithm == "grpo"
        prompts = b.rl_prompts if grpo else b.rl_prompts * b.group_size
        saving = [f"trainer.save_freq={b.rl_steps}", "trainer.test_freq=0"]
        if b.val_every > 0:  # keep every validated checkpoint; the best on validation is the one scored on test
            saving = [
                f"trainer.save_freq={b.val_every}",
                f"trainer.test_freq={b.val_every}",
                "trainer.val_before_train=true",
                f"trainer.max_ckpt_to_keep={-(-b.rl_steps // b.val_every) + 1}",
                f"data.val_max_samples={b.val_questions}",
            ]
        return merge_overrides(
            [
                f"algorithm={algorithm}",
                f"model.path={start}",
                f"trainer.default_local_dir={run_dir}",
                f"trainer.total_training_steps={b.rl_steps}",
                *saving,
                "trainer.resume=disable",
                "trainer.logger=[console,jsonl]",
                # every worker gets all cores: the loop's phases (actor, critic) never compute at the same time
                f"trainer.torch_threads_per_worker={os.cpu_count() or 1}",
                # the same samples per step for both: GRPO prompts x group, PPO as many prompts x 1
                f"data.train_batch_size={prompts}",
                f"actor_rollout_ref.rollout.n={b.group_size if grpo else 1}",
                # two optimizer steps per batch: more updates for the same rollouts
                f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts // 2}",
                *self.shared(),
            ],
            RL_DEFAULTS,
            b.rl_overrides,
            self.rl_overrides,
        )


def finished_samples(folder: Path, model: Path, questions: int, samples: int) -> Path | None:
    """The newest finished ``main_eval`` run in ``folder`` that sampled ``questions`` x ``samples`` from ``model``
    (its ``metrics.json`` is written last, so a run cut off midway does not count), or None."""
    for metrics_file in sorted(folder.glob("*/metrics.json"), reverse=True):
        metrics = json.loads(metrics_file.read_text())
        same = metrics.get("model") == str(model) and metrics.get("n_samples") == samples
        if same and metrics.get("eval/all/n") == questions * samples:
            return metrics_file.parent
    return None


def phase_seconds(run_dir: Path) -> dict[str, float]:
    """Mean seconds per step of each ``timing/*`` phase over a run's ``metrics.jsonl`` (first step left out)."""
    from search_rl.tracking.jsonl import read_jsonl

    lines = read_jsonl(run_dir / "metrics.jsonl")
    rows = lines[1:] or lines
    keys = sorted({k for r in rows for k in r if k.startswith("timing/")})
    return {k.removeprefix("timing/"): sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys}


def examples(folder: Path, n: int = 3) -> list[dict[str, object]]:
    """The first ``n`` evaluated trajectories that searched (or any, if none did), from ``trajectories.jsonl``."""
    from search_rl.tracking.jsonl import read_jsonl

    (path,) = sorted(folder.glob("*/trajectories.jsonl"))[-1:]
    records = read_jsonl(path)
    searched = [r for r in records if r["stats"]["searches"] > 0]
    picked = (searched or records)[:n]
    return [
        {"question": r["question"], "gold": r["gold"], "response": r["response"], "em": r["reward_components"]["em"]}
        for r in picked
    ]


def lenient_subem(folder: Path) -> float:
    """Share of questions with a gold answer anywhere in the model's own text (every model turn, tags or not;
    never the inserted passages): credits an untrained model that answers in a sentence, as the issue measured."""
    from search_rl.reward import sub_exact_match
    from search_rl.tracking.jsonl import read_jsonl

    (path,) = sorted(folder.glob("*/trajectories.jsonl"))[-1:]
    records = read_jsonl(path)
    hits = [
        sub_exact_match(" ".join(s["text"] for s in r["segments"] if s["kind"] == "model"), r["gold"]) for r in records
    ]
    return sum(hits) / max(len(hits), 1)


def paired(out: Path, base: str, other: str) -> dict[str, float]:
    """Questions ``other`` gets right and ``base`` wrong (``better``), the reverse (``worse``), and the exact two-sided
    McNemar p-value of that split (``search_rl.tools.compare_evals``)."""
    from search_rl.tools.compare_evals import load_eval
    from search_rl.tools.compare_evals import paired as compare

    p = compare(load_eval(base, out / "eval" / base), load_eval(other, out / "eval" / other))
    return {"better": p.better, "worse": p.worse, "p": p.p}


def table(bench: Bench) -> str:
    """The rows' markdown table (``rft`` only when it ran: the other rows show ``–`` when not run)."""
    head = (
        "| # | model | EM | sub-EM | F1 | answer rate | searches / question | gold in model text (lenient) |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for i, (row, label) in enumerate(ROWS, 1):
        m = bench.results.get(row)
        if m is None and row == "rft":
            continue
        if m is None:
            lines.append(f"| {i} | {label} | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| {i} | {label} | {m['eval/all/em']:.3f} | {m['eval/all/subem']:.3f} | {m['eval/all/f1']:.3f} "
            f"| {m['eval/all/answer_rate']:.2f} | {m['eval/all/searches']:.2f} "
            f"| {lenient_subem(bench.out / 'eval' / row):.3f} |"
        )
    return "\n".join(lines)


def write_report(bench: Bench, started: float) -> None:
    from search_rl.tools.plot_metrics import plot_run

    out = bench.out
    timings = {
        name: phase_seconds(out / name)
        for name in ("sft", "grpo", "ppo", "rft")
        if (out / name / "metrics.jsonl").is_file()
    }
    plots = {name: [str(p.relative_to(out)) for p in plot_run(out / name, out / "plots" / name)] for name in timings}
    pairs = {
        f"{other} vs {base}": paired(out, base, other)
        for base, other in (
            ("sft", "grpo"),
            ("sft", "ppo"),
            ("sft", "rft"),
            ("naive_rag", "sft"),
            ("naive_rag", "grpo"),
            ("naive_rag", "rft"),
        )
        if base in bench.results and other in bench.results
    }
    trajectories = {
        row: examples(out / "eval" / row) for row in ("sft", "grpo", "ppo", "rft") if (out / "eval" / row).is_dir()
    }
    manifest = out / "rft_data" / "rows.manifest.json"
    rft_rows = json.loads(manifest.read_text()) if manifest.is_file() else None
    payload = {
        "budget": vars(bench.budget),
        "retriever": bench.url,
        "warm_start_rows": bench.warm_start_rows,
        "results": bench.results,
        "seconds_per_step": timings,
        "wall_seconds": {**bench.seconds, "total": time.time() - started},
        "commands": bench.commands,
        "plots": plots,
        "examples": trajectories,
        "paired": pairs,
        "chosen_on_validation": bench.chosen,
        "rft_rows": rft_rows,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False))
    (out / "commands.sh").write_text("#!/bin/sh\nset -e\n" + "\n".join(bench.commands) + "\n")
    md = [
        f"# Learning benchmark ({time.strftime('%Y-%m-%d')})",
        "",
        table(bench),
        "",
        "## Paired comparisons (EM, same questions)",
        "",
    ]
    md += [
        f"- {name}: better on {v['better']}, worse on {v['worse']} questions; exact McNemar p = {v['p']:.3f}"
        for name, v in pairs.items()
    ]
    for name, chosen in bench.chosen.items():
        curve = ", ".join(f"{step}: {em:.3f}" for step, em in sorted(chosen["val_em"].items()))  # type: ignore[attr-defined]
        md.append(f"- **{name}** scored at step {chosen['step']}, chosen on validation EM by step ({curve})")
    if rft_rows is not None:
        md.append(
            f"- **rft** rows: {rft_rows['rows_kept']} right trajectories of {rft_rows['questions_kept']} of the "
            f"{rft_rows['questions_sampled']} sampled questions ({rft_rows['records_read']} samples; left out: "
            f"{rft_rows['skipped_by_reason']}) + {rft_rows.get('mixed_rows', 0)} warm-start rows"
        )
    md += ["", "## Seconds per step by phase", ""]
    for name, phases in timings.items():
        md.append(f"- **{name}**: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    md += ["", "## Wall time per command (s)", ""]
    md += [f"- {k}: {v:.0f}" for k, v in payload["wall_seconds"].items()]
    md += ["", "## Commands", "", "```sh", *bench.commands, "```", "", "## Example trajectories", ""]
    for row, recs in trajectories.items():
        for r in recs:
            md += [
                f"**{row}** — {r['question']} (gold {r['gold']}, EM {r['em']})",
                "",
                "```",
                str(r["response"]),
                "```",
                "",
            ]
    (out / "results.md").write_text("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="tiny budgets (a few minutes): proves the pipeline, not learning"
    )
    ap.add_argument("--retriever-url", default=None, help="a running retriever; default: start the dense one")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default runs/learning_bench[_quick])")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the base model")
    ap.add_argument("--sft-override", action="append", default=[], help="extra main_sft override (repeatable)")
    ap.add_argument(
        "--rl-override", action="append", default=[], help="extra main_ppo override, both runs (repeatable)"
    )
    ap.add_argument(
        "--rft-override", action="append", default=[], help="extra main_sft override of the rft row (repeatable)"
    )
    ap.add_argument(
        "--rows",
        default="base,closed_book,naive_rag,sft,grpo,ppo",
        help="rows to run, comma-separated, of: " + ",".join(r for r, _ in ROWS),
    )
    ap.add_argument("--report-only", action="store_true", help="rewrite the report of a finished run, run nothing")
    ap.add_argument("--profile", choices=sorted(PROFILES), default=None, help="budgets (default full; --quick: quick)")
    ap.add_argument("--warm-start", type=Path, default=None, help="reuse this main_sft checkpoint instead of training")
    ap.add_argument(
        "--warm-start-rows",
        type=Path,
        default=None,
        help=f"the warm start's trajectories (python -m data_prep.synth_sft; default {WARM_START_FILE}): the sft row "
        "trains on them, the rft row mixes them in",
    )
    ap.add_argument("--rl-steps", type=int, default=None, help="RL steps (default: the profile's)")
    ap.add_argument(
        "--val-every", type=int, default=None, help="validate every N RL steps, score the best (default: profile's)"
    )
    args = ap.parse_args()
    budget = PROFILES[args.profile or ("quick" if args.quick else "full")]
    if args.rl_steps is not None:
        budget = dataclasses.replace(budget, rl_steps=args.rl_steps)
    if args.val_every is not None:
        budget = dataclasses.replace(budget, val_every=args.val_every)
    out = (args.out or REPO / ("runs/learning_bench_quick" if args.quick else "runs/learning_bench")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = set(args.rows.split(","))
    unknown = rows - {r for r, _ in ROWS}
    if unknown:
        ap.error(f"--rows: unknown row(s) {', '.join(sorted(unknown))}; choose from {', '.join(r for r, _ in ROWS)}")
    if args.warm_start_rows is not None and not args.warm_start_rows.is_file():
        ap.error(f"--warm-start-rows: no file {args.warm_start_rows}")
    started = time.time()
    if args.report_only:
        previous = json.loads((out / "results.json").read_text())
        bench = Bench(out, previous["retriever"], budget, commands=previous["commands"])
        bench.results, bench.seconds = previous["results"], previous["wall_seconds"]
        bench.warm_start_rows = previous.get("warm_start_rows", WARM_START_FILE)
        bench.chosen = {  # JSON made the steps strings
            row: {"step": c["step"], "val_em": {int(k): v for k, v in c["val_em"].items()}}
            for row, c in previous.get("chosen_on_validation", {}).items()
        }
        started = time.time() - bench.seconds.pop("total")
        write_report(bench, started)
        print((out / "results.md").read_text().split("\n## ")[0])
        return
    with contextlib.ExitStack() as stack:
        url = args.retriever_url
        if url is None:
            from retriever_server.launcher import RetrieverProcess

            server = stack.enter_context(
                RetrieverProcess(log_path=out / "logs" / "retriever.log", ready_timeout_s=1800)
            )
            url = server.url + "/retrieve"
        bench = Bench(out, url, budget, args.sft_override, args.rl_override, args.rft_override)
        bench.warm_start = args.warm_start.resolve() if args.warm_start else None
        if args.warm_start_rows is not None:
            bench.warm_start_rows = str(args.warm_start_rows.resolve())
        try:
            for row, baseline in (("base", "search"), ("closed_book", "no_search"), ("naive_rag", "naive_rag")):
                if row in rows:
                    bench.evaluate(row, args.model, baseline)
            if rows & {"sft", "grpo", "ppo", "rft"}:
                sft = bench.train_sft()
                if "sft" in rows:
                    bench.evaluate("sft", str(sft), "search")
                for algorithm in ("grpo", "ppo"):
                    if algorithm in rows:
                        bench.evaluate(algorithm, str(bench.train_rl(algorithm, sft)), "search")
                if "rft" in rows:
                    bench.evaluate("rft", str(bench.train_rft(sft)), "search")
        finally:
            write_report(bench, started)
    print((out / "results.md").read_text().split("\n## ")[0])
    em = {
        row: bench.results[row]["eval/all/em"]
        for row in ("base", "naive_rag", "sft", "grpo", "ppo", "rft")
        if row in bench.results
    }
    names = {"base": "base", "naive_rag": "rag", "sft": "sft", "grpo": "grpo", "ppo": "ppo", "rft": "rft"}
    print("learning_bench " + " ".join(f"{names[k]}={v:.3f}" for k, v in em.items()))


if __name__ == "__main__":
    main()
