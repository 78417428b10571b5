"""The README's first command (``make demo``): from the shipped data to a trained, evaluated, inspectable policy.

    python -m search_rl.demo                     # retriever → short PPO run on SmolLM2-135M → eval → summary
    python -m search_rl.demo --steps 5 --prompts 4
    python -m search_rl.demo --model tiny        # a random 2-layer Llama: checks the plumbing in about a minute
    python -m search_rl.demo --serve-only        # only start the retriever, query it, serve until Ctrl-C

The journey: check the shipped corpus and datasets (``data/``), start ``uvicorn retriever_server.app:app`` in the
background through ``RetrieverProcess`` and wait for ``/health``, showing the index build's progress it reports (the
first start builds the dense index from the shipped embeddings in seconds and caches it under
``~/.cache/search-rl/indexes``; without matching embeddings it encodes the corpus, minutes), train with
the default recipe (``configs/ppo_trainer.yaml``: PPO with a critic) under small budgets, with a progress bar,
evaluate the last checkpoint greedily with ``main_eval`` on a slice of the test split, render the training curves,
and print where everything is. The retriever it started is stopped on success, failure and Ctrl-C.

Re-running reuses what exists: the cached index, the converted model, and the run folder (``runs/demo``): a run
that already reached ``--steps`` is not trained again (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
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

from retriever_server.corpus import split_contents
from retriever_server.launcher import RetrieverProcess, free_port
from retriever_server.settings import get_settings
from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging

logger = logging.getLogger("search_rl.demo")

DEMO_QUERIES = [
    "who got the first nobel prize in physics",
    "when was the last time anyone was on the moon",
    "What science fantasy young adult series, told in first person, has companion books about enslaved worlds?",
]
DATASET_DIR = Path("data/datasets/nq_hotpotqa_mini")
CORPUS = Path("data/corpus/wiki_mini.jsonl.gz")


@dataclass(frozen=True)
class DemoSettings:
    """The knobs of the demo run (the rest is the default recipe)."""

    steps: int
    prompts: int
    eval_samples: int
    run_dir: Path
    model: str
    max_turns: int
    fresh: bool


def train_overrides(s: DemoSettings, retriever_url: str) -> list[str]:
    """Hydra overrides of the demo run: the default recipe with budgets small enough for minutes on 2 CPU cores."""
    model = ["model=tiny"] if s.model == "tiny" else []
    return [
        *model,
        f"retriever.url={retriever_url}",
        f"trainer.default_local_dir={s.run_dir}",
        "trainer.experiment_name=demo",
        f"trainer.total_training_steps={s.steps}",
        f"trainer.save_freq={s.steps}",
        "trainer.test_freq=0",
        "trainer.max_ckpt_to_keep=1",
        f"trainer.logger=[{'jsonl,tensorboard' if importlib.util.find_spec('tensorboard') else 'jsonl'}]",
        f"trainer.resume={'disable' if s.fresh else 'auto'}",
        f"data.train_batch_size={s.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts}",
        f"max_turns={s.max_turns}",
        "actor_rollout_ref.rollout.max_turn_tokens=64",
        "actor_rollout_ref.rollout.max_obs_tokens=160",
        "actor_rollout_ref.rollout.max_response_tokens=400",
    ]


def eval_overrides(s: DemoSettings, retriever_url: str, actor_dir: Path) -> list[str]:
    """``main_eval`` overrides: greedy, with search, on a seeded slice of the shipped test split."""
    return [
        f"model.path={actor_dir}",
        f"retriever.url={retriever_url}",
        f"data.max_samples={s.eval_samples}",
        f"max_turns={s.max_turns}",
        "actor_rollout_ref.rollout.max_turn_tokens=64",
        "actor_rollout_ref.rollout.max_obs_tokens=160",
        "actor_rollout_ref.rollout.max_response_tokens=400",
        f"output_dir={s.run_dir / 'eval'}",
    ]


class ProgressSink:
    """A ``Tracker`` sink that drives a tqdm bar: step, reward, EM and the ETA of the remaining steps."""

    def __init__(self, total_steps: int, first_step: int = 0) -> None:
        self.bar = tqdm(total=total_steps, initial=first_step, desc="train", unit="step", dynamic_ncols=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.bar.set_postfix(
            reward=f"{metrics.get('reward/score_mean', float('nan')):.3f}",
            em=f"{metrics.get('reward/em', float('nan')):.3f}",
            searches=f"{metrics.get('rollout/searches_mean', float('nan')):.2f}",
            step_s=f"{metrics.get('timing/step_s', float('nan')):.0f}",
        )
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


def train(s: DemoSettings, url: str) -> Path:
    """The short training run (resumed or skipped when ``runs/demo`` already has it); returns the last checkpoint."""
    from search_rl.checkpoint import CheckpointManager
    from search_rl.config import load_config
    from search_rl.main_ppo import prepare
    from search_rl.main_ppo import train as run_training

    overrides = train_overrides(s, url)
    cfg = load_config(overrides)
    latest = CheckpointManager(s.run_dir, 1).resolve("auto")
    done = 0 if latest is None or s.fresh else int(latest.name.rsplit("_", 1)[-1])
    if done >= s.steps:
        logger.info("reusing %s (already trained %d steps; --fresh to train again)", latest, done)
        assert latest is not None
        return latest
    if s.fresh:  # trainer.resume=disable keeps old lines in metrics.jsonl; a fresh demo run starts a clean file
        (s.run_dir / "metrics.jsonl").unlink(missing_ok=True)
    logger.info("training: python -m search_rl.main_ppo %s", " ".join(overrides))
    config_dict: dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[assignment]
    prepared = prepare(cfg, config_dict)
    prepared.tracker.sinks.append(ProgressSink(s.steps, done))
    run_training(cfg, prepared)
    latest = CheckpointManager(s.run_dir, 1).resolve("auto")
    if latest is None:
        raise RuntimeError(f"training finished but left no checkpoint in {s.run_dir}")
    return latest


def find_eval(s: DemoSettings, actor_dir: Path) -> tuple[str, Path] | None:
    """An earlier evaluation of the same checkpoint on as many questions (the result line and its folder), if any."""
    if s.fresh:
        return None
    for metrics_path in sorted((s.run_dir / "eval").glob("search-*/metrics.json"), reverse=True):
        m = json.loads(metrics_path.read_text())
        if m.get("model") == str(actor_dir) and m.get("eval/all/n") == s.eval_samples:
            line = "eval n={} em={:.4f} subem={:.4f} f1={:.4f}".format(
                s.eval_samples, m["eval/all/em"], m["eval/all/subem"], m["eval/all/f1"]
            )
            return line, metrics_path.parent
    return None


def evaluate(s: DemoSettings, url: str, checkpoint: Path) -> tuple[str, Path]:
    """Greedy evaluation of the checkpoint's actor with search; returns the result line and the output folder."""
    from search_rl.main_eval import evaluate as run_eval
    from search_rl.main_eval import load_eval_config

    previous = find_eval(s, checkpoint / "actor")
    if previous is not None:
        logger.info("reusing the evaluation in %s (--fresh to train and evaluate again)", previous[1])
        return previous
    overrides = eval_overrides(s, url, checkpoint / "actor")
    logger.info("evaluating: python -m search_rl.main_eval %s", " ".join(overrides))
    result = run_eval(load_eval_config(overrides))
    return result.summary, result.output_dir


def plot(run_dir: Path) -> list[Path]:
    """Training curves as PNGs under ``<run>/plots`` (none, with a warning, when matplotlib is missing)."""
    try:
        from search_rl.tools.plot_metrics import plot_run
    except ImportError as e:
        logger.warning("no plots: %s (pip install matplotlib)", e)
        return []
    return plot_run(run_dir)


def summarize(s: DemoSettings, checkpoint: Path, eval_line: str, eval_dir: Path, plots: list[Path]) -> None:
    """Where everything is, and what to run next."""
    run = s.run_dir
    lines = [
        "",
        "demo done:",
        f"  checkpoint   {checkpoint}/actor   (an HF model folder)",
        f"  metrics      {run / 'metrics.jsonl'}"
        + (f"   (tensorboard --logdir {run / 'tensorboard'})" if (run / "tensorboard").is_dir() else ""),
        f"  plots        {run / 'plots'}/ ({len(plots)} PNGs)",
        f"  rollouts     {run / 'rollouts'}/   and {eval_dir / 'trajectories.jsonl'}",
        f"  evaluation   {eval_line}   ({eval_dir / 'metrics.json'})",
        f"  view them    python -m search_rl.tools.rollout_viewer {run}",
        f"  train more   python -m search_rl.demo --steps {s.steps * 2}",
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
    """Retriever up → train → evaluate → plots → summary; the retriever is stopped whatever happens."""
    check_data()
    settings = get_settings()
    logger.info(
        "starting the retriever (%s over %s); the first start builds and caches the index ...",
        settings.method.value,
        settings.corpus_path,
    )
    t0 = time.perf_counter()
    retriever = RetrieverProcess(port=port, ready_timeout_s=3600, log_path=s.run_dir / "retriever.log")
    with started(retriever) as server:
        logger.info("retriever ready in %.0fs at %s", time.perf_counter() - t0, server.url)
        checkpoint = train(s, server.url)
        t_train = time.perf_counter()
        eval_line, eval_dir = evaluate(s, server.url, checkpoint)
        t_eval = time.perf_counter()
    plots = plot(s.run_dir)
    logger.info(
        "times: retriever+training %.0fs, evaluation %.0fs, total %.0fs",
        t_train - t0,
        t_eval - t_train,
        time.perf_counter() - t0,
    )
    summarize(s, checkpoint, eval_line, eval_dir, plots)
    sys.stdout.flush()
    sys.stdout.write(eval_line + "\n")  # the result line, last on stdout (as main_eval)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve-only", action="store_true", help="only start the retriever, query it, keep serving")
    ap.add_argument("--exit", action="store_true", help="with --serve-only: stop after the demo queries")
    ap.add_argument("--port", type=int, default=8000, help="retriever port (a free one if taken; 0 = any free port)")
    ap.add_argument("--topk", type=int, default=3, help="passages shown per query (--serve-only)")
    ap.add_argument("--steps", type=int, default=3, help="training steps")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per training step")
    ap.add_argument("--eval-samples", type=int, default=8, help="test questions scored after training")
    ap.add_argument("--max-turns", type=int, default=2, help="search turns per episode")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="policy to train")
    ap.add_argument("--run-dir", type=Path, default=Path("runs/demo"), help="where the run goes")
    ap.add_argument("--fresh", action="store_true", help="train from scratch even if the run folder has checkpoints")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    port = start_port(args.port)
    if args.serve_only:
        return serve(port, args.topk, keep_serving=not args.exit)
    s = DemoSettings(args.steps, args.prompts, args.eval_samples, args.run_dir, args.model, args.max_turns, args.fresh)
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
