"""The training commands in the user docs are valid and live in one place: every ``python -m search_rl.main_ppo``
command in a fenced block of README.md, bench/README.md or docs/**/*.md (not docs/experiments/, dated logs of their
day) is in docs/recipes.md, and each one composes, types, resolves and passes the cross-field checks that
``main_ppo`` runs before Ray starts (``load_config``, ``PPOConfig.validate``, ``check_mode``). A renamed key, a value
out of range or a preset that no longer exists fails here, naming the page and line.

Run: python -m pytest tests/test_docs_commands.py -q
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from search_rl.configure import load_config
from search_rl.main_ppo import check_mode
from search_rl.models import SMOLLM2, load_tokenizer, model_context_length
from search_rl.rollout.engines import choice

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {
        REPO / "README.md",
        REPO / "bench" / "README.md",
        *(p for p in (REPO / "docs").rglob("*.md") if "experiments" not in p.relative_to(REPO).parts),
    }
)
RECIPES = REPO / "docs" / "recipes.md"
ENTRY = "search_rl.main_ppo"
FENCE = re.compile(r"^\s*(```|~~~)")
HYDRA_FLAGS = {"--cfg": 1}
"""Hydra's own flags and how many words follow each (``--cfg job``): not overrides."""


def fenced_commands(doc: Path) -> list[tuple[int, str]]:
    """``(line, command)`` of each shell command in ``doc``'s fenced blocks: ``\\`` continuations joined, ``#``
    comments dropped."""
    out: list[tuple[int, str]] = []
    fenced, start, pending = False, 0, ""
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        start = start if pending else number
        text = pending + " " + line.strip() if pending else line.strip()
        if text.endswith("\\"):
            pending = text[:-1].rstrip()
            continue
        pending = ""
        command = re.split(r"\s+#\s", text, maxsplit=1)[0].strip()
        if command and not command.startswith("#"):
            out.append((start, command))
    return out


def main_ppo_overrides(command: str) -> list[str] | None:
    """The Hydra overrides of a ``python -m search_rl.main_ppo`` command as a shell passes them (quotes removed,
    Hydra's flags dropped); None for another command. A placeholder (``<GPUs>``) is passed as it is, so it fails:
    a recipe a user copies must run as written."""
    if ENTRY not in command:
        return None
    argv = shlex.split(command)
    if len(argv) < 3 or not re.fullmatch(r"(.*/)?python3?", argv[0]) or argv[1:3] != ["-m", ENTRY]:
        return None
    args, overrides = iter(argv[3:]), []
    for arg in args:
        if arg in HYDRA_FLAGS:
            for _ in range(HYDRA_FLAGS[arg]):
                next(args)
        else:
            overrides.append(arg)
    return overrides


@cache
def context_length(source: str) -> int:
    return model_context_length(source, load_tokenizer(source))


ALL = [(doc, line, cmd) for doc in DOCS for line, cmd in fenced_commands(doc) if main_ppo_overrides(cmd) is not None]
RECIPE_COMMANDS = [(line, cmd) for doc, line, cmd in ALL if doc == RECIPES]


def test_every_main_ppo_command_lives_in_the_recipes() -> None:
    elsewhere = [f"{doc.relative_to(REPO)}:{line}: {cmd}" for doc, line, cmd in ALL if doc != RECIPES]
    assert not elsewhere, "move these to docs/recipes.md and link its section instead:\n" + "\n".join(elsewhere)
    assert len(RECIPE_COMMANDS) >= 10  # the page is read at all: a broken fence would leave nothing to check


@pytest.mark.parametrize(("line", "command"), RECIPE_COMMANDS, ids=[f"recipes.md:{n}" for n, _ in RECIPE_COMMANDS])
def test_recipe_command_passes_the_checks_before_ray(line: int, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # rollout.engine=auto probes the model's head width when vLLM is installed; the recipes' checkpoints are not here
    monkeypatch.setattr(choice, "vllm_installed", lambda: False)
    overrides = main_ppo_overrides(command)
    assert overrides is not None
    cfg = load_config(overrides)
    # every recipe trains SmolLM2-135M, a checkpoint of it (runs/...), the tiny model, or a chat model of longer context
    source = "tiny" if cfg.model.path == "tiny" else SMOLLM2
    cfg.validate(cfg.actor_rollout_ref.rollout.hf.max_model_len or context_length(source))
    check_mode(cfg)


def test_commands_are_read_as_a_shell_reads_them(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text(
        "python -m search_rl.main_ppo prose=1\n```bash\npython -m search_rl.main_ppo a=1 \\\n    b=2   # why\n"
        "# python -m search_rl.main_ppo c=3\n.venv/bin/python -m search_rl.main_ppo --cfg job \"d='x,y'\"\n"
        "python -m search_rl.main_eval e=4\nyou -> python -m search_rl.main_ppo (a diagram)\n```\n"
    )
    commands = fenced_commands(doc)
    assert [line for line, _ in commands] == [3, 6, 7, 8]
    assert [main_ppo_overrides(c) for _, c in commands] == [["a=1", "b=2"], ["d='x,y'"], None, None]
