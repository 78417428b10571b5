"""bench/gpu_round.py: its CUDA stages fit one 10-minute command, a stage past its limit is killed with its children
and the round goes on, and the summary reads the target figures (best engine, generate share, log-prob check) from
the stages' lines.

    python -m pytest -q tests/bench/test_gpu_round.py
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def rnd(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("gpu_round")


def test_cuda_stages_fit_one_command_with_margin(rnd: ModuleType, tmp_path: Path) -> None:
    plan = rnd.stages("cuda", ["--tokenizer", "tok"], tmp_path)
    assert [s.name for s in plan] == ["profile", "bench-3b", "bench-135m", "gpu_check"]
    assert sum(s.limit_s for s in plan) <= 600 - 60  # a command runs at most 10 minutes; the wheels and start need room
    assert all("--tokenizer" in s.cmd for s in plan)


def test_a_stage_past_its_limit_is_killed_with_its_children(rnd: ModuleType, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('check x ok started', flush=True); time.sleep(60)"
    )
    stage = rnd.Stage("slow", [sys.executable, "-c", script], 3.0)
    start = time.perf_counter()
    out = rnd.run_stage(stage, tmp_path, dict(os.environ))
    assert time.perf_counter() - start < 30
    assert stage.status == "timed out" and "check x ok started" in out
    time.sleep(0.5)
    assert not _running(int(pid_file.read_text()))  # the stage's child went with it


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process whose parent died may stay a zombie until something reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_summary_reads_the_targets(rnd: ModuleType) -> None:
    def bench(engine: str, arch: str, seqs: int, tok_s: int) -> str:
        return (
            f"static_engine_bench engine={engine} arch={arch} case=plain seqs={seqs} max_batch=256 prompt_tokens=256 "
            f"new_tokens=128 prefill_tok_s=90000 decode_tok_s={tok_s + 500} tok_s={tok_s} first_s=3.10 "
            "roofline=0.310 reused_tokens=0 dtype=bfloat16 device=NVIDIA_H100 commit=abc torch=2.11 transformers=5.17"
        )

    outputs = {
        "bench-3b": "\n".join([bench("hf", "qwen2.5-3b", 64, 1400), bench("static", "qwen2.5-3b", 256, 12345)]),
        "gpu_check": "check logprob ok mean |engine - trainer| log-prob per step 0.004 (bound 0.047)\n"
        "check graph_replay FAILED row 3 differs\n"
        "gpu_check ok device=H100 arch=qwen2.5-3b gen_share=0.590 logprob_diff=0.004",
    }
    summary = rnd.summarize(outputs, [])
    assert summary["tok_s qwen2.5-3b"].startswith("12,345 (static, 256 sequences")
    assert summary["tok_s qwen2.5-3b"].endswith("target >= 10,000: met)")
    assert summary["tok_s smollm2-135m"] == "not measured"
    assert summary["generate share"].startswith("59.0%") and "missed" in summary["generate share"]
    assert summary["logprob"].startswith("ok mean") and "0.047" in summary["logprob"]
    assert summary["failed checks"] == ["graph_replay"]
