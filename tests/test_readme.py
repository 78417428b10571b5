"""The README cannot rot: follow its Quick start literally in a fresh ``git clone``, with small settings.

The commands are read from the README's "Quick start" code blocks, not copied here, so an edited README is what gets
tested. Each one runs in the clone with a virtualenv that sees the system's packages (``--system-site-packages``),
so ``make``'s ``pip install -e .`` points the venv, never the system interpreter, at the clone. The settings are
small: the tiny model, one training step, BM25 (its index builds in seconds), a two-question evaluation, and only
the tool tests for ``make test``. The rollout viewer is a TUI: its command is checked by opening the demo's run in
the clone's viewer under textual's headless driver.

Run: python -m pytest tests/test_readme.py -q -m slow   (about 3-4 minutes on 2 cores)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
DEMO_ARGS = (
    "--model tiny --sft-steps 1 --sft-batch 2 --steps 1 --prompts 2 --group-size 2 --eval-samples 2 --max-turns 1"
)
VIEWER_CHECK = """
import asyncio, sys
from search_rl.tools.rollout_viewer import RolloutViewer, load_records
async def main():
    app = RolloutViewer(load_records(__import__("pathlib").Path(sys.argv[1])))
    async with app.run_test() as pilot:
        await pilot.press("n")
        assert app.query_one("DataTable").row_count > 0
        await pilot.press("q")
asyncio.run(main())
print("viewer ok")
"""


def quick_start_commands(readme: str) -> list[str]:
    """The shell commands of the Quick start section's ``bash`` blocks, comments stripped."""
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def _run(command: str, cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    proc = subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` failed with {proc.returncode}:\n{output[-4000:]}"
    return output


def test_quick_start_in_a_fresh_clone(tmp_path):
    commands = quick_start_commands((REPO / "README.md").read_text())
    assert commands[:3] == ["git clone <this repo> search-rl && cd search-rl", "make demo", "make test"], commands
    clone = tmp_path / "search-rl"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "RETRIEVER_METHOD": "bm25",
        "RETRIEVER_SHOW_PROGRESS": "false",
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
    }

    out = _run(f"make demo PYTHON={python} DEMO_ARGS='{DEMO_ARGS} --port 0'", clone, env, 900)
    run = clone / "runs" / "demo"
    assert re.search(r"^demo n=2 em base=\S+ sft=\S+ rl=\S+$", out, re.MULTILINE), out[-3000:]
    assert "| model | EM |" in out and "rl vs sft: better on" in out  # the table and the paired comparison
    assert (run / "sft" / "global_step_1" / "actor" / "config.json").exists()
    assert (run / "rl" / "global_step_1" / "actor" / "config.json").exists()
    assert (run / "rl" / "metrics.jsonl").exists() and (run / "plots" / "recipe.png").exists()
    assert list((run / "rl" / "rollouts").glob("train_step_*.jsonl"))
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["base", "rl", "sft"]
    assert f"python -m search_rl.tools.rollout_viewer {Path('runs/demo/rl')}" in out
    again = _run(f"make demo PYTHON={python} DEMO_ARGS='{DEMO_ARGS} --port 0'", clone, env, 900)
    for stage in ("sft", "rl"):  # re-running reuses the trained stages and their evaluations
        assert f"reusing runs/demo/{stage}/global_step_1" in again
    assert "reusing the rl evaluation" in again

    _run(f"make test PYTHON={python} PYTEST_ARGS='-q tests/search_rl/tools/test_plot_metrics.py'", clone, env, 600)

    for command in commands[3:]:
        argv = shlex.split(command)
        assert argv[:2] == ["python", "-m"], f"unexpected Quick start command {command!r}: teach this test about it"
        if argv[2] == "search_rl.tools.rollout_viewer":
            out = _run(f"{python} -c {shlex.quote(VIEWER_CHECK)} {shlex.quote(argv[3])}", clone, env, 300)
            assert "viewer ok" in out
        else:
            _run(shlex.join([python, *argv[1:]]), clone, env, 300)
    assert list((run / "rl" / "plots").glob("reward.png"))
