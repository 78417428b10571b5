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
2. GRPO from it (``main_ppo algorithm=grpo``, LoRA adapters, F1 partial credit, no KL term, dynamic sampling over up
   to two generation batches per step) → ``runs/demo/rl``;
3. greedy evaluation with search (``main_eval``) of the base model, the warm start and the RL policy on the same
   held-out test questions → ``runs/demo/eval/<stage>``;
4. a table (EM, F1, answer rate, searches, gold retrieved) with paired comparisons (``tools.compare_evals``), the
   curves (``runs/demo/plots/recipe.png`` and each stage's panels), and where everything is.

Every stage shows the policy up to 384 tokens of passages per search (``--max-obs-tokens``, the trainer's default).
The console shows progress, one result line per stage and the final table; every metric is in the stage's files
(``metrics.jsonl``, ``eval/<stage>/*/metrics.json``).

The retriever it started is stopped on success, failure and Ctrl-C (exit code 130). Re-running reuses what exists:
the cached index, the converted model, finished stages and their evaluations (``--fresh`` starts over; a retrained
warm start retrains and re-evaluates what follows it).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from retriever_server.launcher import RetrieverProcess
from retriever_server.settings import DEFAULT_PORT, get_settings
from search_rl.demo.budgets import check_budgets
from search_rl.demo.overrides import sft_overrides, train_overrides
from search_rl.demo.results import plot, summarize, write_results
from search_rl.demo.retriever import serve, start_port, started
from search_rl.demo.settings import STAGES, DemoSettings, check_data
from search_rl.demo.stages import evaluate, train_stage
from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging
from search_rl.tools.compare_evals import load_eval, report

logger = logging.getLogger(__name__)


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
    write_results(s, text, seconds)
    summarize(s, text, rl.checkpoint, plots, seconds)
    sys.stdout.flush()
    ems = " ".join(f"{r.name}={r.metrics['eval/all/em']:.4f}" for r in runs)
    sys.stdout.write(f"demo n={s.eval_samples} em {ems}\n")  # the result line, last on stdout
    return 0


class InterruptRecord:
    """A SIGINT handler that raises ``KeyboardInterrupt`` as Python's own does and records that the signal came, so
    that a Ctrl-C a library turned into another exception (OmegaConf wraps one that lands while Hydra builds its
    config store at import) still ends the demo as an interruption."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        raise KeyboardInterrupt


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1 (the response budget is computed from these)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m search_rl.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    ap.add_argument(
        "--gen-batches",
        type=_positive,
        default=2,
        help="most generation batches per RL step (dynamic sampling fills the step with groups with signal; 1 = off)",
    )
    ap.add_argument("--eval-samples", type=int, default=50, help="test questions each stage is scored on")
    ap.add_argument("--max-turns", type=_positive, default=2, help="search turns per episode")
    ap.add_argument("--max-obs-tokens", type=_positive, default=384, help="tokens of passages shown per search")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="policy to train")
    ap.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="compute dtype of every stage (auto: bf16 where this machine computes it faster)",
    )
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
        gen_batches=args.gen_batches,
        dtype=args.dtype,
    )
    interrupt = InterruptRecord()
    previous = signal.getsignal(signal.SIGINT)
    # Only over Python's default (a SIGINT ignored, as in a job a shell started in the background, stays ignored) and
    # only from the main thread, the one that may set handlers.
    own = previous is signal.default_int_handler and threading.current_thread() is threading.main_thread()
    if own:
        signal.signal(signal.SIGINT, interrupt)
    try:
        return run_demo(s, port)
    except BaseException as e:  # process boundary: say what was cleaned up and where to look
        if isinstance(e, KeyboardInterrupt) or interrupt.received:
            logger.error("interrupted; the retriever was stopped")
            return 130
        if isinstance(e, Exception):
            logger.error(
                "demo failed; the retriever was stopped. Retriever log: %s; see docs/troubleshooting.md",
                s.run_dir / "retriever.log",
            )
        raise
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)
