"""Import directions (docs/architecture.md): ``data_prep → search_rl → retriever_server`` at package level, and
inside ``search_rl`` the config holds data only: it never imports the algorithms, reward or rollout code that read
it (``search_rl.configure`` resolves registry names).

Run: python -m pytest tests/search_rl/test_import_directions.py -q
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("search_rl", "data_prep"), ("retriever_server", "search_rl"), ("retriever_server", "data_prep")],
)
def test_packages_import_one_way(package: str, forbidden: str):
    offenders = sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in (REPO / package).rglob("*.py")
        for name in _imported_modules(path)
        if name == forbidden or name.startswith(forbidden + ".")
    )
    assert not offenders, offenders


def test_config_imports_no_code_that_reads_it():
    # a fresh interpreter: what importing the config package pulls in, transitively
    code = (
        "import sys, search_rl.config; "
        "print(sorted(m for m in sys.modules if m.startswith('search_rl.') and not m.startswith('search_rl.config')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_check_sees_an_import(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom data_prep.synth_sft import read_input\nfrom . import x\n")
    assert _imported_modules(module) == {"os", "data_prep.synth_sft"}
