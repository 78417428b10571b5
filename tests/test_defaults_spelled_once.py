"""The retriever's default address and the shipped corpus path are spelled once, in ``retriever_server/settings.py``
(``DEFAULT_HOST``, ``DEFAULT_PORT``, ``DEFAULT_URL``, ``SHIPPED_CORPUS``), and every client, tool and script reads
them from there (imports point ``data_prep → search_rl → retriever_server``). Docstrings may show the literal as an
example.

Run: python -m pytest tests/test_defaults_spelled_once.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

from retriever_server.settings import DEFAULT_PORT, DEFAULT_URL, SHIPPED_CORPUS, Settings
from search_rl.config import RetrieverClientConfig

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("retriever_server", "search_rl", "data_prep", "bench")
HOME = Path("retriever_server/settings.py")
SPELLINGS = (":8000", SHIPPED_CORPUS.name)
ELSEWHERE = {Path("bench/search_r1_compare.py")}
"""Files whose literal names something else: Search-R1's own retriever, which hard-codes port 8000."""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (a module's, a function's, a class's or a field's)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                out.add(id(stmt.value))
    return out


def spelled(path: Path) -> list[str]:
    """The non-docstring string constants of ``path`` holding one of ``SPELLINGS``, and ``default=8000`` arguments."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    strings = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and any(s in node.value for s in SPELLINGS)
    ]
    ports = [
        k.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg == "default" and isinstance(k.value, ast.Constant) and k.value.value == DEFAULT_PORT
    ]
    return [f"{path.name}:{node.lineno}: {node.value!r}" for node in strings + ports]


def test_no_module_spells_the_defaults_again():
    files = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    found = [hit for p in files if p.relative_to(REPO) not in {HOME, *ELSEWHERE} for hit in spelled(p)]
    assert not found, f"import DEFAULT_URL / DEFAULT_PORT / SHIPPED_CORPUS from retriever_server.settings: {found}"


def test_the_check_sees_a_literal(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""Docstring: http://127.0.0.1:8000 is fine here."""\nURL = "http://127.0.0.1:8000"\n'
        'ap.add_argument("--port", type=int, default=8000)\n'
    )
    assert spelled(module) == ["module.py:2: 'http://127.0.0.1:8000'", "module.py:3: 8000"]


def test_the_clients_default_is_where_a_default_server_listens():
    fields = Settings.model_fields
    assert f"http://{fields['host'].default}:{fields['port'].default}" == DEFAULT_URL
    assert RetrieverClientConfig().urls == [DEFAULT_URL]
    assert Settings.model_fields["corpus_path"].default == SHIPPED_CORPUS
