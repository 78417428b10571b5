"""The pass/fail checks of ``bench/gpu_check.py`` beyond training itself: captured decode steps against eager ones,
the engine's log-probs against the trainer's, the speed levers against the plain update, and the ``gpu`` tests.

Each check prints ``check <name> ok <what it saw>`` or ``check <name> FAILED <why>`` (``Checks``); gpu_check exits
non-zero naming every failed check. The bounds, and why they are what they are:

- **logprob** (engine vs trainer, ``rollout/logprob_abs_diff``: mean |engine - recomputed| log-prob of a step's
  response tokens): in bf16 at most ``2 * u * sqrt(L) * M`` nats (``u`` = 2^-8, bf16's unit roundoff; ``L`` layers;
  ``M`` the RMS of the model's logits, ``logit_rms``). The two forwards (the engine's, one token at a time over its KV
  cache; the trainer's, the whole sequence at once, with other kernels) each round every layer's outputs to bf16 in
  other places and orders; those roundings add like a random walk over the layers, so the logits differ by about
  ``u * sqrt(L)`` of their scale ``M`` in each (``step_graphs.mismatch_bound`` is that relative difference), and a
  log-prob by the sampled logit's difference less the mean one. The bound is in units of ``M``: random-weight logits
  have ``M`` below 1 (0.48 at SmolLM2-135M's shape: 0.021 nats at 30 layers), a trained model's are several nats
  and so are its bound's units. Measured on this CPU in bf16 at that shape (30 layers; 8 prompts x 32 sampled
  tokens): 0.0045 for the static engine, 0.0043 for the HF engine. A stale cache column, a wrong position or a wrong
  mask moves log-probs by the logits' whole scale, ``M`` or more. On the tiny Llama in bf16 on CPU
  (``tests/bench/test_gpu_gates.py``): 2.0e-4 at its ``M`` of 0.16 (bound 1.8e-3) and 6.0e-3 at 30 times its logits
  (``M`` 4.8; bound 0.053), where the fixed ``2 u sqrt(L)`` nats this gate had (0.011) does not scale; an engine that
  drops the sampling temperature is off by 0.059 and 13.9. In float32 the bound is ``1e-4 * M`` (the static engine
  tests' per-token tolerance; measured 3.5e-6, HF engine, trained SmolLM2, CPU).
- **levers** (``bench/update_levers.py``: each lever alone and all on, against the levers off, same batch and
  weights): loss and gradient norm within ``u`` relative (3.9e-3 in bf16; 1e-4 in float32; the loss relative to
  at least 1, as it is a mean of per-token terms of about |advantage| ~ 1 that cancel near 0). The levers change
  summation orders and micro-batch shapes only, so loss and gradient norm (means over thousands of tokens) keep
  their rounding (measured at 3B, bf16: loss identical, gradient norm within 3e-4); a dropped, repeated or
  misweighted micro-batch moves them by percents. The update: every row starts from the same weights with a fresh
  AdamW and takes one optimizer step at ``LEVER_LR`` (``update_levers``), which must be AdamW's first step for the
  gradient the row accumulated, element by element (``adamw_step_excess`` at most 1): a lever that steps per
  micro-batch, scales the step or writes weights outside the optimizer moves weights by about ``LEVER_LR``, hundreds
  of times the step's float32 rounding.
- **graph_replay**: the static engine with CUDA graphs against the same engine replaying each step eagerly (same
  row and width buckets, so the same kernels): greedy tokens equal row by row, a row's first differing token
  allowed only at a near tie (the two log-probs within the engine's replay bound, ``graphs.bound``, which is
  ``step_graphs.replay_bound``), log-probs before it within that bound; no eager fallback, at least one capture.
  On CPU both engines use a stand-in graph that re-runs the step (the plumbing, not CUDA).
- **gpu_tests**: ``python -m pytest -m gpu`` over the test files that carry the marker (they import without Ray,
  FAISS or vLLM); on CUDA every one must pass and none may be skipped, on CPU they are skipped (no CUDA).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BF16_UNIT_ROUNDOFF = 2.0**-8
FP32_LOGPROB_BOUND = 1e-4
"""Per unit of the logits' RMS (module docstring)."""
FP32_LEVER_TOLERANCE = 1e-4
FP32_EPS = 2.0**-23
STEP_ROUNDINGS = 10
"""Float32 roundings in AdamW's first step, each relative to the step (``(1 - b1) g``, ``(1 - b2) g^2``, the square
root, two bias corrections, ``+ eps``, the division, ``lr`` times it), rounded up; as in
``tests/search_rl/workers/worker_factory.assert_same_adamw_step``."""


class CheckFailed(Exception):
    """A check saw something outside its bound; the message says what."""


class Checks:
    """Runs named checks, prints one line each, and remembers the failures."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def run(self, name: str, check: Callable[[], str]) -> bool:
        """Run ``check`` (it returns what it saw, or raises ``CheckFailed``); print its line; whether it passed.
        Any other exception fails the check too, with its traceback printed (the next checks still run)."""
        try:
            detail = check()
        except CheckFailed as e:
            return self.fail(name, str(e))
        except Exception as e:  # a check that crashed is a failed check; report it and go on to the others
            traceback.print_exc()
            return self.fail(name, f"crashed: {e!r:.300}")
        print(f"check {name} ok {detail}", flush=True)
        return True

    def fail(self, name: str, why: str) -> bool:
        print(f"check {name} FAILED {why}", flush=True)
        self.failed.append(name)
        return False

    def exit_if_failed(self) -> None:
        """Exit 1 naming the failed checks, if any."""
        if self.failed:
            sys.exit(f"gpu_check FAILED {' '.join(self.failed)}")


def logprob_bound(compute_dtype: str, layers: int, logit_scale: float) -> float:
    """The largest mean |engine - trainer| log-prob a correct engine shows for logits of RMS ``logit_scale`` (module
    docstring).

    >>> round(logprob_bound("bfloat16", 36, 1.0), 4), logprob_bound("float32", 36, 0.5)
    (0.0469, 5e-05)
    """
    if compute_dtype == "float32":
        return FP32_LOGPROB_BOUND * logit_scale
    if compute_dtype != "bfloat16":
        raise ValueError(f"logprob_bound: no bound derived for {compute_dtype!r} (bfloat16 or float32)")
    return 2 * BF16_UNIT_ROUNDOFF * math.sqrt(max(layers, 1)) * logit_scale


def logit_rms(model_dir: Path, device: str, compute_dtype: str, positions: int = 256) -> float:
    """The RMS of the logits of the model in ``model_dir`` over ``positions`` positions of a fixed sequence of random
    token ids (the scale ``logprob_bound`` is in units of)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if compute_dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    vocab = min(int(model.config.vocab_size), 40000)
    ids = torch.randint(100, vocab, (1, positions), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    rms = float(logits.square().mean().sqrt())
    del model, logits
    if device == "cuda":
        torch.cuda.empty_cache()
    return rms


def check_logprobs(history: Sequence[dict[str, float]], compute_dtype: str, layers: int, logit_scale: float) -> str:
    """Every step's engine-vs-trainer log-prob difference within ``logprob_bound`` for logits of RMS ``logit_scale``
    (``logit_rms``)."""
    diffs = [m["rollout/logprob_abs_diff"] for m in history if "rollout/logprob_abs_diff" in m]
    if not diffs:
        raise CheckFailed("no step logged rollout/logprob_abs_diff (the old log-probs were not recomputed)")
    bound = logprob_bound(compute_dtype, layers, logit_scale)
    worst = max(diffs)
    seen = (
        f"mean |engine - trainer| log-prob per step {', '.join(f'{d:.3g}' for d in diffs)} (bound {bound:.3g} at"
        f" logit RMS {logit_scale:.3g})"
    )
    if not worst <= bound:
        raise CheckFailed(seen)
    return seen


def lever_tolerance(compute_dtype: str) -> float:
    """Relative tolerance on loss and gradient norm between two lever settings (module docstring)."""
    return BF16_UNIT_ROUNDOFF if compute_dtype == "bfloat16" else FP32_LEVER_TOLERANCE


def adamw_step_excess(before, after, grads, lr: float, weight_decay: float, eps: float = 1e-8) -> float:
    """How far weights moved otherwise than AdamW's first step (fresh moments) for ``grads`` moves them, in units of
    the step's float32 rounding: the largest ``|after - expected| / bound`` over all elements (at most 1 for a correct
    step; inf for a non-finite weight).

    AdamW's first step is ``expected = w (1 - lr wd) - lr g / (|g| + eps)`` (the bias corrections cancel the first
    moments' ``1 - b``), computed in float32 with ``STEP_ROUNDINGS`` roundings relative to the step ``lr |g| / (|g| +
    eps)`` and two of the weight (the decay's product and the subtraction), each under a float32 step of it
    (``eps32 |w|``): ``bound = STEP_ROUNDINGS * eps32 * |step| + 2 * eps32 * |w|``. Measured on the tiny Llama with
    torch's for-loop, foreach and fused AdamW at lr 1e-6 to 1e-2: at most 0.55 (the weight's two roundings); a step
    at another rate, a second step, none, or a weight written by 1e-6 outside it: 20 to 10^6.

    Args:
        before, after, grads: per parameter, the weights before and after the step and the gradient it applied (the
            one present at ``optimizer.step()``, after clipping), on one device each.
        lr, weight_decay, eps: what the optimizer was configured with (not read back from it: a step at another
            rate is what this catches).
    """
    import torch

    worst = 0.0
    for w0, w1, g in zip(before, after, grads, strict=True):
        w0, w1, g = w0.double(), w1.to(w0.device).double(), g.to(w0.device).double()
        step = lr * g / (g.abs() + eps)
        expected = w0 * (1 - lr * weight_decay) - step
        bound = STEP_ROUNDINGS * FP32_EPS * step.abs() + 2 * FP32_EPS * w0.abs()
        excess = (w1 - expected).abs() / bound.clamp_min(torch.finfo(torch.float32).tiny)
        worst = max(worst, float(torch.nan_to_num(excess, nan=math.inf).max()))
    return worst


def check_levers(rows: Sequence[Any], compute_dtype: str) -> str:
    """Each lever row's loss and gradient norm against the first row (levers off), and every row's update against
    AdamW's first step for its own gradient (module docstring)."""
    if len(rows) < 2:
        raise CheckFailed(f"{len(rows)} lever rows; need the levers off and at least one lever")
    off, tol = rows[0], lever_tolerance(compute_dtype)
    limits = {"loss": tol, "grad_norm": tol}
    worst = dict.fromkeys(limits, 0.0)
    bad = []
    for row in rows[1:]:
        for key, limit in limits.items():
            # the loss is a mean of per-token terms of about |advantage| ~ 1 that cancel near 0: its rounding is of 1
            floor = 1.0 if key == "loss" else 1e-12
            diff = abs(getattr(row, key) - getattr(off, key)) / max(abs(getattr(off, key)), floor)
            worst[key] = max(worst[key], diff)
            if not diff <= limit:
                bad.append(f"{row.name}: {key} {getattr(row, key):.6g} vs {getattr(off, key):.6g} (rel {diff:.2e})")
    for row in rows:
        if row.optimizer_steps != 1:
            bad.append(f"{row.name}: {row.optimizer_steps} optimizer steps for one mini-batch")
        elif not row.step_excess <= 1:
            bad.append(f"{row.name}: weights off AdamW's step by {row.step_excess:.3g} x its rounding")
    excess = max(row.step_excess for row in rows)
    seen = (
        f"{len(rows) - 1} settings vs off: loss rel {worst['loss']:.2e}, grad norm rel {worst['grad_norm']:.2e} "
        f"(tolerance {tol:.2e}); updates off AdamW's step by at most {excess:.3g} x its float32 rounding (limit 1)"
    )
    if bad:
        raise CheckFailed("; ".join(bad) + f" [{seen}]")
    return seen


class ReplayStandIn:
    """A stand-in for a CUDA graph: ``capture`` records the step and runs it once, ``replay`` runs it again and
    writes its logits into the captured output (what a graph replay does to its static output)."""

    def capture(self, fn: Callable[[], Any]) -> Any:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        self.out.copy_(self.fn())


def compare_greedy(graphed: Sequence[Any], eager: Sequence[Any], bound: float) -> tuple[int, int, float, list[str]]:
    """(identical rows, rows that part at a near tie, largest log-prob difference before parting, problems) of two
    engines' greedy outputs of the same prompts."""
    same = ties = 0
    worst = 0.0
    problems = []
    for i, (g, e) in enumerate(zip(graphed, eager, strict=True)):
        gt, et = list(g.token_ids), list(e.token_ids)
        part = next((j for j, (a, b) in enumerate(zip(gt, et, strict=False)) if a != b), None)
        common = min(len(gt), len(et)) if part is None else part
        diffs = [abs(a - b) for a, b in zip(g.logprobs[:common], e.logprobs[:common], strict=True)]
        worst = max([worst, *diffs])
        if part is None and len(gt) == len(et):
            same += 1
        elif part is not None and abs(g.logprobs[part] - e.logprobs[part]) <= bound:
            ties += 1
        else:
            where = part if part is not None else common
            problems.append(
                f"row {i} differs at token {where} (graph {gt[where : where + 3]}, eager {et[where : where + 3]})"
            )
    if worst > bound:
        problems.append(f"log-probs before the tokens part differ by {worst:.3g} > {bound:.3g}")
    return same, ties, worst, problems


def check_graph_replay(
    model_dir: Path, device: str, rows: int = 16, new_tokens: int = 48, graph_factory: Callable[[], Any] | None = None
) -> str:
    """The static engine's captured decode steps against eager replays of the same steps (module docstring), on
    ``rows`` slots refilled with 1.5x as many prompts, in two calls (the second grows the cache). ``graph_factory``
    makes the graphs under test (None: CUDA graphs on CUDA, ``ReplayStandIn`` on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from search_rl.config import HFEngineConfig
    from search_rl.datatypes import SamplingParams
    from search_rl.rollout.engines.static import StaticEngine
    from search_rl.tags import STOP_STRINGS

    gpu = device == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    dtype = torch.bfloat16 if gpu else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    cfg = HFEngineConfig(max_batch_size=rows)
    factory = graph_factory or (None if gpu else ReplayStandIn)
    graphed = StaticEngine(model, tokenizer, cfg, graph_factory=factory)
    eager = StaticEngine(model, tokenizer, cfg, graph_factory=ReplayStandIn)  # same buckets, each step run eagerly
    params = SamplingParams(max_new_tokens=new_tokens, greedy=True, stop=STOP_STRINGS)
    gen = torch.Generator().manual_seed(0)
    vocab = min(len(tokenizer), 40000)
    same = ties = total = 0
    worst = 0.0
    problems: list[str] = []
    for scale in (1, 4):  # the second call's longer prompts grow the cache: new graphs in a new pool
        lengths = torch.randint(8 * scale, 64 * scale, (rows + rows // 2,), generator=gen).tolist()  # refills slots
        prompts = [torch.randint(100, vocab, (n,), generator=gen).tolist() for n in lengths]
        a, b, w, p = compare_greedy(
            graphed.generate(prompts, params), eager.generate(prompts, params), graphed.graphs.bound
        )
        same, ties, worst, total = same + a, ties + b, max(worst, w), total + len(prompts)
        problems += p
    seen = (
        f"{same}/{total} rows identical, {ties} parted at a near tie; captures {graphed.captures}, "
        f"replay check max difference {graphed.graphs.max_difference:.3g} (bound {graphed.graphs.bound:.3g}), "
        f"fallbacks {graphed.graph_fallbacks}, log-probs max |diff| {worst:.3g}"
    )
    if graphed.graph_fallbacks > 0:
        problems.append(f"{graphed.graph_fallbacks} calls fell back to eager decoding")
    if graphed.captures == 0:
        problems.append("no decode step was captured")
    del graphed, eager, model
    if gpu:
        torch.cuda.empty_cache()
    if problems:
        raise CheckFailed("; ".join(problems) + f" [{seen}]")
    return seen


def gpu_test_files(repo: Path) -> list[Path]:
    """The test files that carry the ``gpu`` marker."""
    return sorted(p for p in (repo / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())


def check_gpu_tests(repo: Path, device: str, timeout_s: float = 300.0) -> str:
    """``pytest -m gpu`` over ``gpu_test_files``: all pass (on CUDA none skipped)."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        raise CheckFailed("pytest is not importable here (make gpu-wheels carries it in .whl/)")
    files = [str(p.relative_to(repo)) for p in gpu_test_files(repo)]
    if not files:
        raise CheckFailed("no test file carries the gpu marker")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *files]
    try:
        done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise CheckFailed(f"pytest -m gpu ran past {timeout_s:.0f} s") from e
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", flush=True)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", done.stdout)}
    seen = f"{' '.join(files)}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    if done.returncode != 0:
        raise CheckFailed(f"pytest exited {done.returncode}; {seen}")
    if device == "cuda" and (counts.get("skipped", 0) or not counts.get("passed", 0)):
        raise CheckFailed(f"on CUDA every gpu test must run; {seen}")
    return seen
