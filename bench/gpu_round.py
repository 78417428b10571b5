"""One GPU session's measurements in one command of at most 10 minutes: the decode profile, the engine bench, the
GPU check, then a summary of the target figures.

Stages, each a child process under its own time limit (its whole process group is killed when the limit passes; the
next stage still runs), each writing ``<out>/<stage>.log``:

1. ``profile``: ``bench/decode_profile.py`` at the Qwen2.5-3B and SmolLM2-135M shapes, 64 and 256 rows
   (``<out>/decode_profile.json``): kernels per decode step, device idle share, top kernels;
2. ``bench-3b``, ``bench-135m``: ``bench/static_engine_bench.py``, 64 and 256 rows, 128 new tokens, fresh prompts,
   engines ``hf``, ``static``, ``static-compiled``;
3. ``gpu_check``: ``bench/gpu_check.py --arch qwen2.5-3b`` (its checks, its phase table).

Time limits on CUDA (seconds): profile 80, bench-3b 120, bench-135m 70, gpu_check 260 (530 in all, under the
10-minute limit of one command with room for the wheels and the start); ``--limit STAGE=SECONDS`` changes one.
The summary (printed last and written to ``<out>/summary.json``) gives each stage's outcome and the targets: at least
10,000 tokens/s end to end (prefill included) at 3B and 20,000 at 135M (the best engine and size of the bench), a
generate share of at most 40% of a training step, and the engine-vs-trainer log-prob difference within its bound.
Targets are reported, not enforced; the exit status is 1 when a stage failed or ran out of time.

On a bare CUDA machine (bench/README.md, "GPU check"), with the repository and ``make gpu-wheels``'s ``.whl/``::

    SEARCH_RL_COMMIT=<short hash> python3 bench/gpu_round.py --wheels .whl --out "$OUT"

``--device cpu`` rehearses every stage on CPU at small sizes (2 decoder layers of each shape, 4 and 8 rows, 32-token
prompts, 8 steps or new tokens, the engines ``hf`` and ``static``; gpu_check's own CPU rehearsal) with longer limits:
the plumbing, not the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE = Path(tempfile.gettempdir()) / "search-rl-gpu-check-site"
TARGET_TOK_S = {"qwen2.5-3b": 10_000.0, "smollm2-135m": 20_000.0}
"""End-to-end tokens/s to reach (prefill included), by shape."""
GENERATE_SHARE_TARGET = 0.40
LIMITS_S = {
    "cuda": {"profile": 80, "bench-3b": 120, "bench-135m": 70, "gpu_check": 260},
    "cpu": {"profile": 600, "bench-3b": 600, "bench-135m": 600, "gpu_check": 3000},
}


@dataclass
class Stage:
    """One stage's command and what became of it."""

    name: str
    cmd: list[str]
    limit_s: float
    status: str = "not run"
    seconds: float = 0.0


def stages(device: str, tokenizer: list[str], out: Path) -> list[Stage]:
    """The commands of the round on ``device`` (module docstring)."""
    py = [sys.executable]
    engines = ["--engines", "hf", "static", "static-compiled"]
    if device == "cuda":
        profile = ["--arch", "qwen2.5-3b", "smollm2-135m", "--rows", "64", "256"]
        size = ["--seqs", "64", "256", "--max-batch-size", "256", "--new-tokens", "128"]
        check = ["--arch", "qwen2.5-3b"]
    else:  # small enough for a 2-core CPU: the plumbing, not the figures
        profile = ["--arch", "qwen2.5-3b", "smollm2-135m", "--layers", "2", "--rows", "4", "8", "--prompt-tokens", "32"]
        profile += ["--steps", "8"]
        size = ["--layers", "2", "--seqs", "4", "8", "--max-batch-size", "8", "--prompt-tokens", "32"]
        size += ["--new-tokens", "8"]
        engines = ["--engines", "hf", "static"]  # compiling on 2 shared cores takes minutes and measures nothing
        check = []
    dev = ["--device", device]
    bench = [*py, "bench/static_engine_bench.py", *dev, *tokenizer, *size, *engines]
    limits = LIMITS_S[device]
    return [
        Stage(
            "profile",
            [*py, "bench/decode_profile.py", *dev, *tokenizer, *profile, "--out", str(out / "decode_profile.json")],
            limits["profile"],
        ),
        Stage("bench-3b", [*bench, "--arch", "qwen2.5-3b"], limits["bench-3b"]),
        Stage("bench-135m", [*bench, "--arch", "smollm2-135m"], limits["bench-135m"]),
        Stage(
            "gpu_check",
            [*py, "bench/gpu_check.py", *dev, *tokenizer, *check, "--out", str(out / "gpu_check")],
            limits["gpu_check"],
        ),
    ]


KEY_LINE = re.compile(r"^(static_engine_bench |decode_profile |check |gpu_check |target|  +\d)")
"""Lines echoed to the console as they come (the rest is in the stage's log)."""


def run_stage(stage: Stage, out: Path, env: dict[str, str]) -> str:
    """Run ``stage`` under its limit, its output into ``<out>/<name>.log`` (key lines echoed); returns the output."""
    log = out / f"{stage.name}.log"
    print(f"== {stage.name} (limit {stage.limit_s:.0f} s): {' '.join(stage.cmd)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            stage.cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: a time limit kills its children too
        )  # fmt: skip
        assert proc.stdout is not None
        deadline = start + stage.limit_s
        timer = _Killer(proc, deadline)
        for line in proc.stdout:
            sink.write(line)
            sink.flush()  # on disk as it comes: a command killed from outside still leaves the log
            if KEY_LINE.match(line):
                print(line, end="", flush=True)
        rc = proc.wait()
        timer.cancel()
    stage.seconds = time.perf_counter() - start
    stage.status = "timed out" if timer.fired else ("ok" if rc == 0 else f"failed (exit {rc})")
    print(f"== {stage.name}: {stage.status} in {stage.seconds:.0f} s", flush=True)
    return log.read_text()


class _Killer:
    """Kills a process group at a deadline (from a timer thread: the reader blocks on the pipe)."""

    def __init__(self, proc: subprocess.Popen[str], deadline: float) -> None:
        self.fired = False
        self.proc = proc
        self.timer = threading.Timer(max(deadline - time.perf_counter(), 0.0), self._kill)
        self.timer.daemon = True
        self.timer.start()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.fired = True
            os.killpg(self.proc.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self.timer.cancel()


def _fields(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def summarize(outputs: dict[str, str], stages_run: list[Stage]) -> dict[str, object]:
    """The target figures found in the stages' outputs, each with whether it met its target."""
    summary: dict[str, object] = {"stages": [asdict(s) | {"cmd": " ".join(s.cmd)} for s in stages_run]}
    text = "\n".join(outputs.values())
    for arch, target in TARGET_TOK_S.items():
        lines = [_fields(x) for x in text.splitlines() if x.startswith("static_engine_bench ") and f"arch={arch} " in x]
        rated = [f for f in lines if "tok_s" in f]
        if not rated:
            summary[f"tok_s {arch}"] = "not measured"
            continue
        best = max(rated, key=lambda f: float(f["tok_s"]))
        tok_s = float(best["tok_s"])
        summary[f"tok_s {arch}"] = (
            f"{tok_s:,.0f} ({best['engine']}, {best['seqs']} sequences, prefill {best['prefill_tok_s']} tok/s, "
            f"decode {best['decode_tok_s']} tok/s, roofline {best['roofline']}; target >= {target:,.0f}: "
            f"{'met' if tok_s >= target else 'missed'})"
        )
    final = [_fields(x) for x in text.splitlines() if x.startswith("gpu_check ok ")]
    if final:
        share = float(final[-1]["gen_share"])
        verdict = "met" if share <= GENERATE_SHARE_TARGET else "missed"
        summary["generate share"] = f"{share:.1%} of the step (target <= {GENERATE_SHARE_TARGET:.0%}: {verdict})"
    else:
        summary["generate share"] = "not measured (gpu_check did not finish)"
    checks = [x for x in text.splitlines() if x.startswith("check ")]
    logprob = next((x for x in checks if x.startswith("check logprob ")), None)
    summary["logprob"] = logprob.removeprefix("check logprob ") if logprob else "not measured"
    summary["failed checks"] = [x.split()[1] for x in checks if x.split()[2:3] == ["FAILED"]]
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--wheels", type=Path, default=None, help="install this folder's wheels first (make gpu-wheels)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="default: <wheels>/tokenizer, else SmolLM2's")
    ap.add_argument("--out", type=Path, default=None, help="default: $OUT, else a new temporary folder")
    ap.add_argument("--limit", action="append", default=[], metavar="STAGE=SECONDS", help="a stage's time limit")
    ap.add_argument("--only", nargs="+", default=None, help="run only these stages")
    args = ap.parse_args()
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_round-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.wheels:
        sys.path.insert(0, str(REPO / "bench"))
        from gpu_wheels import install

        print(f"installed {install([args.wheels], SITE)} wheels into {SITE}", flush=True)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), str(REPO), env.get("PYTHONPATH")]))
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    tokenizer = args.tokenizer or (args.wheels / "tokenizer" if args.wheels else None)
    plan = stages(args.device, ["--tokenizer", str(tokenizer)] if tokenizer else [], out)
    known = {s.name for s in plan}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in known or not seconds.replace(".", "", 1).isdigit():
            ap.error(f"--limit {item!r}: expected STAGE=SECONDS with STAGE one of {', '.join(sorted(known))}")
        next(s for s in plan if s.name == name).limit_s = float(seconds)
    if args.only and (unknown := set(args.only) - known):
        ap.error(f"--only: unknown stages {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    run = [s for s in plan if args.only is None or s.name in args.only]
    print(f"gpu_round: device {args.device}, outputs in {out}, limits in all {sum(s.limit_s for s in run):.0f} s")
    outputs = {s.name: run_stage(s, out, env) for s in run}
    summary = summarize(outputs, run)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n== summary")
    for s in run:
        print(f"stage {s.name}: {s.status} ({s.seconds:.0f} s of {s.limit_s:.0f})")
    for key, value in summary.items():
        if key != "stages":
            print(f"{key}: {value}")
    if any(s.status != "ok" for s in run):
        sys.exit("gpu_round: " + ", ".join(f"{s.name} {s.status}" for s in run if s.status != "ok"))


if __name__ == "__main__":
    main()
