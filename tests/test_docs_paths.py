"""Every repository path and module the user docs name in backticks exists: README.md, bench/README.md and
docs/**/*.md (not docs/experiments/, dated logs that describe the tree of their day).

A path is a word of an inline code span that starts with a top-level entry of the repository (``search_rl/``,
``data/``, ``Makefile``, ...) and contains a ``/`` or ends in ``.py``, ``.md`` or ``.yaml``: it must name a file or
folder. Placeholders (``<stage>``, ``...``) and globs (``*``, ``{a,b}``) must match at least one. ``path:line`` and
``path::name`` are checked as ``path``. A module is a dotted name under one of the packages
(``search_rl.tools.diagnose``, ``retriever_server.app:app``): its longest existing module prefix must define the next
name, if any. Paths under ``runs/`` (run outputs) and other projects' files are not checked.

Run: python -m pytest tests/test_docs_paths.py -q
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {
        REPO / "README.md",
        REPO / "bench" / "README.md",
        *(p for p in (REPO / "docs").rglob("*.md") if "experiments" not in p.relative_to(REPO).parts),
    }
)
PACKAGES = ("search_rl", "retriever_server", "data_prep", "bench")
FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"(`+)((?:(?!\1).)+)\1")
PLACEHOLDER = re.compile(r"<[^<>]*>|\.\.\.")
NOT_OURS = frozenset({"runs", "verl", "skyrl", "trl", "Search-R1", "openrlhf"})
"""Run outputs (``runs/demo/rl``) and other projects whose files the docs cite (``verl/workers/actor/dp_actor.py``)."""
MODULE = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)+(?::\w+)?$")


def top_level(root: Path) -> frozenset[str]:
    """The names a repository path may start with: the root's entries but outputs, hidden ones only ``.ci``."""
    names = {p.name for p in root.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
    return frozenset(names - NOT_OURS)


def code_spans(text: str) -> list[tuple[int, str]]:
    """``(line number, content)`` of each inline code span outside fenced blocks."""
    spans, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            spans += [(number, m.group(2)) for m in SPAN.finditer(line)]
    return spans


def expand_braces(word: str) -> list[str]:
    """``a/{b,c}.py`` → ``a/b.py``, ``a/c.py`` (one level, any number of groups)."""
    parts = re.split(r"\{([^{}]*,[^{}]*)\}", word)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def words(span: str) -> list[str]:
    """A code span's words: split at spaces, ``=``, brackets and quotes (not at the commas of a ``{a,b}`` glob)."""
    out = []
    for raw in re.split(r"[\s=();\"']+|,(?![^{]*\})", span):
        word = re.sub(r"(::\w+|:\d+(-\d+)?|[.:,])+$", "", raw)
        if word:
            out.append(word)
    return out


def path_words(span: str, root: Path) -> list[tuple[str, str]]:
    """``(word, path relative to the root)`` for each word of a code span that is a repository path (placeholders
    turned into ``*``). A ``.py`` path that starts inside a package (``rollout/engines/hf/engine.py``) is looked up in
    the first package with a folder of that name (``search_rl``'s when none has one: then it does not exist)."""
    tops = top_level(root)
    paths = []
    for word in words(PLACEHOLDER.sub("*", span)):
        first = word.split("/", 1)[0]
        if first in tops and ("/" in word or word.endswith((".py", ".md", ".yaml"))):
            paths.append((word, word))
        elif "/" in word and word.endswith(".py") and first not in NOT_OURS:
            homes = [p for p in PACKAGES if (root / p / first).is_dir()] or [PACKAGES[0]]
            paths.append((word, f"{homes[0]}/{word}"))
    return paths


def path_exists(word: str, root: Path) -> bool:
    for candidate in expand_braces(word):
        candidate = candidate.rstrip("/")
        if any(c in candidate for c in "*?["):
            if not next(root.glob(candidate), None):
                return False
        elif not (root / candidate).exists():
            return False
    return True


def defines(source: str, name: str) -> bool:
    """Whether a module's source defines or imports ``name`` at any level (a lenient check against stale names)."""
    return bool(
        re.search(
            rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|^\s*(?:from\s+\S+\s+)?import\s.*\b{name}\b"
            rf"|^\s+{name},?\s*$",  # the last: a line of a parenthesised import
            source,
            re.MULTILINE,
        )
    )


def module_exists(dotted: str, root: Path) -> bool:
    """``pkg.mod.attr`` (or ``pkg.mod:attr``): the longest prefix that is a module or package, and the next name,
    if any, defined in it."""
    parts = dotted.replace(":", ".").split(".")
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        for source in (base.with_suffix(".py"), base / "__init__.py", base):
            if source.is_file() or (source == base and base.is_dir()):
                if n == len(parts):
                    return True
                text = source.read_text() if source.is_file() else ""
                return defines(text, parts[n])
    return False


def stale_references(doc: Path, root: Path = REPO) -> list[str]:
    """``file:line: reference`` for each path or module named in ``doc``'s code spans that does not exist."""
    stale = []
    for number, span in code_spans(doc.read_text()):
        where = f"{doc.relative_to(root)}:{number}"
        stale += [f"{where}: {w} (no such path)" for w, path in path_words(span, root) if not path_exists(path, root)]
        for word in words(span):
            if MODULE.match(word) and not module_exists(word, root):
                stale.append(f"{where}: {word} (no such module or name)")
    return stale


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_named_paths_and_modules_exist(doc: Path):
    stale = stale_references(doc)
    assert not stale, "stale references (rename them to where the thing lives now):\n" + "\n".join(stale)


def test_the_check_sees_paths_placeholders_globs_and_modules(tmp_path: Path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "a.py").write_text("def run():\n    pass\n")
    (tmp_path / "search_rl" / "rollout").mkdir(parents=True)
    (tmp_path / "search_rl" / "__init__.py").write_text("")
    (tmp_path / "search_rl" / "rollout" / "hf.py").write_text("")
    (tmp_path / "search_rl" / "tool.py").write_text("app = 1\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "`pkg/sub/a.py:12` `pkg/sub/<name>.py` `pkg/*/a.py` `pkg/sub/{a,b}.py` `python pkg/sub/gone.py -q`\n"
        "`search_rl.tool:app` `search_rl.tool.gone` `search_rl.missing` `runs/x/y.py` `a.py` `verl/x.py`\n"
        "`rollout/hf.py` `rollout/gone.py` `agent/gone.py`\n"
        "```\npkg/nothing.py `pkg/nothing.py`\n```\n"
    )
    assert [s.split(": ", 1)[1] for s in stale_references(doc, tmp_path)] == [
        "pkg/sub/{a,b}.py (no such path)",
        "pkg/sub/gone.py (no such path)",
        "search_rl.tool.gone (no such module or name)",
        "search_rl.missing (no such module or name)",
        "rollout/gone.py (no such path)",
        "agent/gone.py (no such path)",
    ]
