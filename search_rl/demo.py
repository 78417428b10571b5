"""The README's first command (``make demo``): the Search-R1 recipe in small, from the shipped data to a policy that
searches better than the model it started from.

    python -m search_rl.demo                     # retriever → warm start → GRPO → eval base / warm start / RL
    python -m search_rl.demo --steps 6 --eval-samples 100
    python -m search_rl.demo --model tiny        # a random 2-layer Llama: checks the plumbing in a few minutes
    python -m search_rl.demo --serve-only        # only start the retriever, query it, serve until Ctrl-C

The journey: check the shipped corpus and datasets (``data/``), start the retriever (``python -m retriever_server``)
in the background through ``RetrieverProcess`` and wait for ``/health``, showing the index build it reports (the
first start builds the dense index from the shipped embeddings in seconds and caches it under
``~/.cache/search-rl/indexes``), then the recipe with small budgets, each stage with a progress bar:

1. a short supervised warm start (``main_sft``) on the shipped search trajectories → ``runs/demo/sft``;
2. GRPO from it (``main_ppo algorithm=grpo``, LoRA adapters, F1 partial credit, no KL term) → ``runs/demo/rl``;
3. greedy evaluation with search (``main_eval``) of the base model, the warm start and the RL policy on the same
   held-out test questions → ``runs/demo/eval/<stage>``;
4. a table (EM, F1, answer rate, searches, gold retrieved) with paired comparisons (``tools.compare_evals``), the
   curves (``runs/demo/plots/recipe.png`` and each stage's panels), and where everything is.

Every stage shows the policy up to 384 tokens of passages per search (``--max-obs-tokens``, the trainer's default).
The console shows progress, one result line per stage and the final table; every metric is in the stage's files
(``metrics.jsonl``, ``eval/<stage>/*/metrics.json``).

The retriever it started is stopped on success, failure and Ctrl-C. Re-running reuses what exists: the cached index,
the converted model, finished stages and their evaluations (``--fresh`` starts over; a retrained warm start retrains
and re-evaluates what follows it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from omegaconf import OmegaConf
from tqdm import tqdm

from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.passages import split_contents
from retriever_server.settings import DEFAULT_PORT, SHIPPED_CORPUS, get_settings
from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging
from search_rl.tools.compare_evals import EvalRun, load_eval, report

logger = logging.getLogger("search_rl.demo")

DEMO_QUERIES = [
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "What science fantasy young adult series, told in first person, has companion books about enslaved worlds?",
]
DATASET_DIR = Path("data/datasets/nq_hotpotqa_mini")
RL_QUESTIONS = DATASET_DIR / "rl_kept.parquet"
"""The training questions RL draws from: those the recipe's warm start answered right in 1 to 3 of 4 samples
(``bench/rl_stages.sh 1``; counts in ``rl_kept.manifest.json``). A question it always or never solves gives GRPO a
group of equal rewards, which teaches nothing."""
CORPUS = SHIPPED_CORPUS


TURN_TOKENS = 64
"""Tokens the policy may write per turn."""

STAGES = ("base", "sft", "rl")
"""The rows of the demo's table, in recipe order."""


@dataclass(frozen=True)
class DemoSettings:
    """The knobs of the demo run (the rest is the default recipe)."""

    sft_steps: int
    sft_batch: int
    steps: int
    prompts: int
    group_size: int
    eval_samples: int
    run_dir: Path
    model: str
    max_turns: int
    fresh: bool
    max_obs_tokens: int = 384
    """Tokens of retrieved passages shown per search (the trainer's default; 160 cut the answer out of a third of
    the NQ passages, docs/learning.md)."""
    seed: int = 0
    """``trainer.seed`` of the warm start and RL (data order, sampling); the evaluation questions stay the same."""

    @property
    def max_response_tokens(self) -> int:
        """The response budget: a 64-token turn per search, the answer turn and one turn of tags' slack, plus every
        observation (1024 for the defaults, the budget of the learning runs)."""
        return (self.max_turns + 2) * TURN_TOKENS + self.max_turns * self.max_obs_tokens

    def stage_dir(self, stage: str) -> Path:
        """Where a training stage (``sft``, ``rl``) writes its checkpoints, metrics and rollouts."""
        return self.run_dir / stage


def budget_overrides(s: DemoSettings, retriever_url: str) -> list[str]:
    """The search loop and budgets every stage shares (training and evaluation alike)."""
    return [
        f"retriever.url={retriever_url}",
        f"max_turns={s.max_turns}",
        f"actor_rollout_ref.rollout.max_turn_tokens={TURN_TOKENS}",
        f"actor_rollout_ref.rollout.max_obs_tokens={s.max_obs_tokens}",
        f"actor_rollout_ref.rollout.max_response_tokens={s.max_response_tokens}",
    ]


def _loop(s: DemoSettings, stage: str, steps: int, fresh: bool) -> list[str]:
    logger_names = "jsonl,tensorboard" if importlib.util.find_spec("tensorboard") else "jsonl"
    return [
        f"trainer.default_local_dir={s.stage_dir(stage)}",
        f"trainer.experiment_name=demo_{stage}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
        "trainer.test_freq=0",
        "trainer.max_ckpt_to_keep=1",
        f"trainer.logger=[{logger_names}]",
        f"trainer.resume={'disable' if fresh else 'auto'}",
        f"trainer.seed={s.seed}",
        # every worker gets all cores: the loop's phases never compute at the same time
        f"trainer.torch_threads_per_worker={os.cpu_count() or 1}",
    ]


def sft_overrides(s: DemoSettings, retriever_url: str, fresh: bool = False) -> list[str]:
    """``main_sft`` overrides: a few steps at a high learning rate teach the search protocol (docs/learning.md)."""
    model = ["model=tiny"] if s.model == "tiny" else []
    return [
        *model,
        *_loop(s, "sft", s.sft_steps, fresh),
        f"data.train_batch_size={s.sft_batch}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        *budget_overrides(s, retriever_url),
    ]


def train_overrides(s: DemoSettings, retriever_url: str, start: Path, fresh: bool = False) -> list[str]:
    """``main_ppo`` overrides of the RL stage: GRPO on ``RL_QUESTIONS`` from the warm start ``start`` (a checkpoint
    folder) with LoRA
    adapters (rank 16 at lr 1e-4, the learning recipe's: a cheaper update), mini-batches of half the prompts (at least
    one: several optimizer steps per batch), F1 partial credit so groups of wrong answers still differ, no KL term
    (no reference pass)."""
    return [
        "algorithm=grpo",
        f"model.path={start}",
        *_loop(s, "rl", s.steps, fresh),
        f"data.train_files=[{RL_QUESTIONS}]",
        f"data.train_batch_size={s.prompts}",
        f"actor_rollout_ref.rollout.n={s.group_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, s.prompts // 2)}",
        "model.lora_rank=16",
        "model.lora_alpha=32",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "reward.partial_credit=f1",
        "reward.partial_credit_weight=0.5",
        "algorithm.use_kl_loss=false",
        *budget_overrides(s, retriever_url),
    ]


def eval_overrides(s: DemoSettings, retriever_url: str, stage: str, checkpoint: Path | None) -> list[str]:
    """``main_eval`` overrides: greedy, with search, on a seeded slice of the shipped test split (the same questions
    for every stage); ``checkpoint`` None evaluates the base model."""
    if checkpoint is not None:
        model = [f"model.path={checkpoint / 'actor'}"]
    else:
        model = ["model=tiny"] if s.model == "tiny" else []
    return [
        *model,
        f"data.max_samples={s.eval_samples}",
        f"output_dir={s.run_dir / 'eval' / stage}",
        *budget_overrides(s, retriever_url),
    ]


class ProgressSink:
    """A ``Tracker`` sink that drives a tqdm bar: the step, a few metrics and the ETA of the remaining steps."""

    RL_FIELDS = (("reward", "reward/score_mean"), ("em", "reward/em"), ("searches", "rollout/searches_mean"))
    SFT_FIELDS = (("nll", "sft/nll"),)

    def __init__(
        self,
        total_steps: int,
        first_step: int = 0,
        desc: str = "train",
        fields: tuple[tuple[str, str], ...] = (),
        groups: int = 0,
    ) -> None:
        self.fields = fields or self.RL_FIELDS
        self.groups = groups
        """GRPO groups per step (prompts); with it, each step prints how many had rewards that differ."""
        self.bar = tqdm(total=total_steps, initial=first_step, desc=desc, unit="step", dynamic_ncols=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if "reward/groups_all_equal" in metrics and self.groups:
            with_signal = round(self.groups * (1.0 - metrics["reward/groups_all_equal"]))
            tqdm.write(f"step {step}: {with_signal} of {self.groups} groups with signal (rewards not all equal)")
        shown = {label: f"{metrics.get(key, float('nan')):.3f}" for label, key in self.fields}
        self.bar.set_postfix(**shown, step_s=f"{metrics.get('timing/step_s', float('nan')):.0f}")
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def check_data() -> None:
    """Make sure the shipped corpus and datasets are there.

    Raises:
        FileNotFoundError: naming the missing files and how to restore them (they are part of the repository).
    """
    missing = [p for p in (CORPUS, DATASET_DIR / "train.parquet", DATASET_DIR / "test.parquet") if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"missing {', '.join(map(str, missing))}: the demo runs from the repository root, and these files are "
            "part of it; restore them with `git checkout -- data/` (docs/data.md says how they are rebuilt)"
        )


class BuildProgress:
    """While the retriever starts, polls its ``GET /health`` and shows the index build it reports: a log line per
    step and a tqdm bar for steps that count items (encoding the corpus: passages)."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.seen: list[dict[str, Any]] = []
        """Every distinct progress report read, in order."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retriever-build-progress", daemon=True)
        self._bar: tqdm | None = None
        self._stage: str | None = None

    def __enter__(self) -> BuildProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.close()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    progress = client.get(f"{self.url}/health").json().get("progress")
                except (httpx.HTTPError, ValueError):  # not listening yet, or not JSON
                    continue
                if progress and (not self.seen or progress != self.seen[-1]):
                    self.seen.append(progress)
                    self.show(progress)

    def show(self, progress: dict[str, Any]) -> None:
        """Render one report: a new step logs a line (and opens a bar if it counts items); the same step moves it."""
        stage, done, total = progress["stage"], progress["done"], progress["total"]
        if stage != self._stage:
            self._stage = stage
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            logger.info("retriever: %s (%.0fs since start)", stage, progress["elapsed_s"])
            if total > 0 and done < total:
                self._bar = tqdm(total=total, desc=stage, unit="item", dynamic_ncols=True)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)


@contextmanager
def started(server: RetrieverProcess) -> Iterator[RetrieverProcess]:
    """Start the retriever, showing its build progress until it is ready; stop it on exit, whatever happens."""
    try:
        with BuildProgress(server.url):
            server.start()
        yield server
    finally:
        server.stop()


def start_port(requested: int) -> int:
    """``requested`` when nothing answers there, else a free port (another retriever may be serving)."""
    try:
        httpx.get(f"http://127.0.0.1:{requested}/health", timeout=1)
    except httpx.TransportError:
        return requested
    port = free_port()
    logger.info("port %d is taken; using %d", requested, port)
    return port


def show(url: str, queries: list[str], topk: int) -> None:
    """Query the server and log the top passages per query."""
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}, timeout=60)
    r.raise_for_status()
    for query, hits in zip(queries, r.json()["result"], strict=True):
        logger.info("Q: %s", query)
        for rank, hit in enumerate(hits, start=1):
            title, text = split_contents(hit["document"]["contents"])
            logger.info("  %d. [%.3f] %s  %s", rank, hit["score"], title, text[:110].replace("\n", " ") + "...")


@dataclass(frozen=True)
class StageRun:
    """A finished training stage: its last checkpoint and whether this invocation trained it (then what follows it
    is stale and is trained and evaluated again)."""

    checkpoint: Path
    trained: bool


BUDGETS_FILE = "budgets.json"
"""The run folder's record of the settings its checkpoints and evaluations were made with."""


def run_budgets(s: DemoSettings) -> dict[str, Any]:
    """The settings that make two runs' checkpoints and scores incomparable."""
    return {
        "model": s.model,
        "max_turns": s.max_turns,
        "max_turn_tokens": TURN_TOKENS,
        "max_obs_tokens": s.max_obs_tokens,
        "max_response_tokens": s.max_response_tokens,
        "seed": s.seed,
    }


RECORDED_BEFORE = {"seed": 0}
"""What a run folder recorded before a setting joined ``run_budgets`` was made with."""


def check_budgets(s: DemoSettings) -> None:
    """Refuse to reuse a run folder made with other budgets (its stages would be mixed with this run's); record the
    budgets of a fresh or new folder."""
    path = s.run_dir / BUDGETS_FILE
    current = run_budgets(s)
    if not s.fresh:
        if path.exists():
            recorded = json.loads(path.read_text())
            recorded = {**RECORDED_BEFORE, **recorded}
            diff = {k: (recorded.get(k), v) for k, v in current.items() if recorded.get(k) != v}
            if diff:
                changes = ", ".join(f"{k}: {old} there, {new} now" for k, (old, new) in diff.items())
                raise ValueError(
                    f"{s.run_dir} holds a demo run made with other settings ({changes}); "
                    "pass --fresh to train it again or --run-dir for a new folder"
                )
        elif any((s.run_dir / d).exists() for d in ("sft", "rl", "eval")):
            raise ValueError(
                f"{s.run_dir} holds a demo run without {BUDGETS_FILE} (made before the demo recorded its budgets; "
                "it used 160-token observations); pass --fresh to train it again or --run-dir for a new folder"
            )
    s.run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=1) + "\n")


def train_stage(s: DemoSettings, stage: str, overrides: list[str], steps: int, fresh: bool) -> StageRun:
    """Train one stage (``sft`` or ``rl``) through its entry point's ``prepare``/``train``, or reuse the stage's run
    when it already reached ``steps``; returns its last checkpoint."""
    from search_rl.trainer.checkpoint import CheckpointManager

    run_dir = s.stage_dir(stage)
    latest = CheckpointManager(run_dir, 1).resolve("auto")
    done = 0 if latest is None or fresh else int(latest.name.rsplit("_", 1)[-1])
    if latest is not None and done >= steps:
        logger.info("reusing %s (already trained %d steps; --fresh to train again)", latest, done)
        return StageRun(latest, trained=False)
    if fresh:  # trainer.resume=disable keeps old lines in metrics.jsonl; a fresh stage starts a clean file
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    if stage == "sft":
        from search_rl import main_sft as entry

        cfg: Any = entry.load_sft_config(overrides)
        fields: tuple[tuple[str, str], ...] = ProgressSink.SFT_FIELDS
        groups = 0
    else:
        from search_rl import main_ppo as entry  # type: ignore[no-redef]
        from search_rl.configure import load_config

        cfg = load_config(overrides)
        fields, groups = ProgressSink.RL_FIELDS, cfg.data.train_batch_size
    logger.info("%s: python -m %s %s", stage, entry.__name__, " ".join(overrides))
    config_dict: dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[assignment]
    prepared = entry.prepare(cfg, config_dict)
    prepared.tracker.sinks.append(ProgressSink(steps, done, desc=stage, fields=fields, groups=groups))
    entry.train(cfg, prepared)
    latest = CheckpointManager(run_dir, 1).resolve("auto")
    if latest is None:
        raise RuntimeError(f"{stage} finished but left no checkpoint in {run_dir}")
    return StageRun(latest, trained=True)


def find_eval(s: DemoSettings, stage: str, model: str) -> Path | None:
    """An earlier evaluation of the same model on as many questions, if any (its run folder)."""
    for metrics_path in sorted((s.run_dir / "eval" / stage).glob("search-*/metrics.json"), reverse=True):
        m = json.loads(metrics_path.read_text())
        if m.get("model") == model and m.get("eval/all/n") == s.eval_samples:
            return metrics_path.parent
    return None


METRIC_LINE = re.compile(r"^eval/\S+ = ")
"""A line of ``main_eval``'s per-metric dump (``eval/all/em = 0.2000``), about 40 per evaluation."""


class MetricLinesFilter(logging.Filter):
    """Drops the evaluation's per-metric INFO lines from the console: the stage's summary line says the result, and
    every metric stays in its ``metrics.json``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not METRIC_LINE.match(record.getMessage())


@contextmanager
def without_metric_lines(name: str = "search_rl.evaluation.run") -> Iterator[None]:
    """While the block runs, the logger ``name`` logs everything but its per-metric lines."""
    log, quiet = logging.getLogger(name), MetricLinesFilter()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def evaluate(s: DemoSettings, url: str, stage: str, checkpoint: Path | None, reuse: bool) -> Path:
    """Greedy evaluation of one stage's policy with search (``checkpoint`` None: the base model); returns the output
    folder. ``reuse``: an earlier evaluation of the same model on as many questions is kept."""
    from search_rl.evaluation.run import evaluate as run_eval
    from search_rl.evaluation.run import load_eval_config

    overrides = eval_overrides(s, url, stage, checkpoint)
    cfg = load_eval_config(overrides)
    previous = find_eval(s, stage, str(cfg.model.path)) if reuse else None
    if previous is not None:
        logger.info("reusing the %s evaluation in %s (--fresh to train and evaluate again)", stage, previous)
        return previous
    logger.info("evaluating %s: python -m search_rl.main_eval %s", stage, " ".join(overrides))
    with without_metric_lines():
        result = run_eval(cfg)
    logger.info("%s: %s", stage, result.summary)
    return result.output_dir


def plot(s: DemoSettings, stages: list[EvalRun]) -> list[Path]:
    """The recipe's curves (``plots/recipe.png``) and each training stage's panels (``plots/<stage>/``); none, with
    a warning, when matplotlib is missing."""
    try:
        from search_rl.tools.plot_metrics import Stage, plot_recipe, plot_run
    except ImportError as e:
        logger.warning("no plots: %s (pip install matplotlib)", e)
        return []
    out = s.run_dir / "plots"
    written = [p for stage in ("sft", "rl") for p in plot_run(s.stage_dir(stage), out / stage)]
    ends = {"base": 0, "sft": s.sft_steps, "rl": s.sft_steps + s.steps}
    points = [
        Stage(
            r.name,
            ends[r.name],
            r.metrics["eval/all/em"],
            s.stage_dir(r.name) if r.name != "base" else None,
            questions=s.eval_samples,
        )
        for r in stages
    ]
    return [plot_recipe(points, out), *written]


def summarize(s: DemoSettings, report: str, checkpoint: Path, plots: list[Path], seconds: dict[str, float]) -> None:
    """The table, where everything is, and what to run next."""
    run = s.run_dir
    rl = s.stage_dir("rl")
    times = ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items())
    samples = s.steps * s.prompts * s.group_size
    lines = [
        "",
        report,
        "",
        f"What RL shows at this size: {s.steps} steps of {s.prompts} prompts x {s.group_size} samples ({samples} "
        "samples) move the held-out EM by a question or two either way; recipe.png draws RL's reward as a running "
        "mean with its 95% band, and a change inside the band is noise. The 300-question runs, with their "
        "significance, are in docs/learning.md.",
        "",
        "demo done:",
        f"  policy       {checkpoint}/actor   (an HF model folder; the warm start is under {s.stage_dir('sft')})",
        f"  metrics      {rl / 'metrics.jsonl'}   and {s.stage_dir('sft') / 'metrics.jsonl'}",
        f"  plots        {run / 'plots'}/recipe.png   and {len(plots) - 1} panels under {run / 'plots'}/",
        f"  rollouts     {rl / 'rollouts'}/   and {run / 'eval'}/<stage>/search-<time>/trajectories.jsonl",
        f"  results      {run / 'results.md'}",
        f"  view them    python -m search_rl.tools.rollout_viewer {rl}",
        f"  train more   python -m search_rl.demo --steps {s.steps * 2}",
        f"  times        {times}",
    ]
    logger.info("\n".join(lines))


def serve(port: int, topk: int, keep_serving: bool) -> int:
    """``--serve-only``: start the retriever, query it, and serve until Ctrl-C (or stop at once)."""
    with started(RetrieverProcess(port=port, ready_timeout_s=3600)) as server:
        show(server.url, DEMO_QUERIES, topk)
        if not keep_serving:
            return 0
        logger.info("serving on %s (POST /retrieve, GET /health, GET /metrics); Ctrl-C to stop", server.url)
        try:
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            logger.info("stopping")
    return 0


def run_demo(s: DemoSettings, port: int) -> int:
    """Retriever up → warm start → RL → evaluate every stage → table, plots, summary; the retriever is stopped
    whatever happens."""
    check_data()
    check_budgets(s)
    settings = get_settings()
    retriever = RetrieverProcess(port=port, ready_timeout_s=3600, log_path=s.run_dir / "retriever.log")
    logger.info(
        "starting the retriever at %s (%s over %s); the first start builds and caches the index ...",
        retriever.url,
        settings.method.value,
        settings.corpus_path,
    )
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    with started(retriever) as server:
        url = server.url
        seconds["retriever"] = time.perf_counter() - t0
        logger.info("retriever ready in %.0fs at %s", seconds["retriever"], url)
        t = time.perf_counter()
        sft = train_stage(s, "sft", sft_overrides(s, url, s.fresh), s.sft_steps, s.fresh)
        seconds["warm start"] = time.perf_counter() - t
        t = time.perf_counter()
        rl_fresh = s.fresh or sft.trained  # RL from an older warm start is stale
        rl = train_stage(s, "rl", train_overrides(s, url, sft.checkpoint, rl_fresh), s.steps, rl_fresh)
        seconds["rl"] = time.perf_counter() - t
        t = time.perf_counter()
        reuse = {"base": not s.fresh, "sft": not sft.trained, "rl": not rl.trained}
        checkpoints = {"base": None, "sft": sft.checkpoint, "rl": rl.checkpoint}
        folders = {stage: evaluate(s, url, stage, checkpoints[stage], reuse[stage]) for stage in STAGES}
        seconds["evaluation"] = time.perf_counter() - t
    runs = [load_eval(stage, folders[stage]) for stage in STAGES]
    text = report(runs)
    plots = plot(s, runs)
    seconds["total"] = time.perf_counter() - t0
    (s.run_dir / "results.md").write_text(
        "# Demo results\n\n" + text + "\n\nSeconds: " + json.dumps({k: round(v) for k, v in seconds.items()}) + "\n"
    )
    summarize(s, text, rl.checkpoint, plots, seconds)
    sys.stdout.flush()
    ems = " ".join(f"{r.name}={r.metrics['eval/all/em']:.4f}" for r in runs)
    sys.stdout.write(f"demo n={s.eval_samples} em {ems}\n")  # the result line, last on stdout
    return 0


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1 (the response budget is computed from these)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve-only", action="store_true", help="only start the retriever, query it, keep serving")
    ap.add_argument("--exit", action="store_true", help="with --serve-only: stop after the demo queries")
    ap.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="retriever port (a free one if taken; 0 = any free port)"
    )
    ap.add_argument("--topk", type=int, default=3, help="passages shown per query (--serve-only)")
    ap.add_argument("--sft-steps", type=int, default=10, help="warm-start optimizer steps")
    ap.add_argument("--sft-batch", type=int, default=8, help="warm-start trajectories per step")
    ap.add_argument("--steps", type=int, default=3, help="RL (GRPO) steps")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per RL step")
    ap.add_argument("--group-size", type=int, default=4, help="samples per prompt (the GRPO group)")
    ap.add_argument("--eval-samples", type=int, default=50, help="test questions each stage is scored on")
    ap.add_argument("--max-turns", type=_positive, default=2, help="search turns per episode")
    ap.add_argument("--max-obs-tokens", type=_positive, default=384, help="tokens of passages shown per search")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="policy to train")
    ap.add_argument("--run-dir", type=Path, default=Path("runs/demo"), help="where the run goes")
    ap.add_argument(
        "--seed", type=int, default=0, help="training seed (warm start and RL); the evaluation questions stay the same"
    )
    ap.add_argument("--fresh", action="store_true", help="train from scratch even if the run folder has checkpoints")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    port = start_port(args.port)
    if args.serve_only:
        return serve(port, args.topk, keep_serving=not args.exit)
    s = DemoSettings(
        sft_steps=args.sft_steps,
        sft_batch=args.sft_batch,
        steps=args.steps,
        prompts=args.prompts,
        group_size=args.group_size,
        eval_samples=args.eval_samples,
        run_dir=args.run_dir,
        model=args.model,
        max_turns=args.max_turns,
        fresh=args.fresh,
        max_obs_tokens=args.max_obs_tokens,
        seed=args.seed,
    )
    try:
        return run_demo(s, port)
    except KeyboardInterrupt:
        logger.error("interrupted; the retriever was stopped")
        return 130
    except Exception:  # process boundary: say what was cleaned up and where to look, then fail loudly
        logger.error(
            "demo failed; the retriever was stopped. Retriever log: %s; see docs/troubleshooting.md",
            s.run_dir / "retriever.log",
        )
        raise


if __name__ == "__main__":
    sys.exit(main())
