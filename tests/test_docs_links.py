"""Every relative link in the user docs resolves: README.md, docs/**/*.md and bench/README.md.

A link to a file must name an existing file or folder; a ``#anchor`` into a Markdown file must name one of its
headings, slugged as GitHub slugs them (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for
repeats). Links inside code (fenced blocks, indented blocks, inline spans) are not links and are skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted({REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").rglob("*.md")})
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced and indented code blocks (blanked, so line numbers hold), inline code spans removed."""
    out: list[str] = []
    fenced, prev_blank, prev_code = False, True, False
    for line in text.splitlines():
        if FENCE.match(line) or fenced:
            fenced = fenced != bool(FENCE.match(line))
            out.append("")
            continue
        if line.startswith(("    ", "\t")) and (prev_blank or prev_code):
            out.append("")
            prev_blank, prev_code = False, True
            continue
        prev_code = prev_code and not line.strip()  # a blank line keeps an indented block open
        prev_blank = not line.strip()
        out.append(re.sub(r"(`+)(?:(?!\1).)+\1", "", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text.

    >>> slug("2. Supervised warm start (`python -m search_rl.main_sft`)")
    '2-supervised-warm-start-python--m-search_rlmain_sft'
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: Counter[str] = Counter()
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return frozenset(out)


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``doc`` that does not resolve."""
    broken = []
    for number, line in enumerate(prose_lines(doc.read_text()), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(root)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path):
    broken = broken_links(doc)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_check_sees_links_and_anchors(tmp_path: Path):
    (tmp_path / "a.md").write_text("# Title (`x.py`)\n\n## Two\n\n## Two\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#title-xpy) [ok](a.md#two-1) [bad](a.md#three) [gone](c.md)\n`[code](c.md)`\n\n    [code](c.md)\n"
    )
    assert [b.split(": ", 1)[1] for b in broken_links(doc, tmp_path)] == [
        "a.md#three (no heading with that anchor)",
        "c.md (no such file)",
    ]
