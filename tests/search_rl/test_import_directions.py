"""Import directions (docs/architecture.md): ``data_prep → search_rl → retriever_server`` at package level; inside
``search_rl`` the config holds data only: it never imports the algorithms, reward or rollout code that read it
(``search_rl.configure`` resolves registry names); no module of a package imports an entry point
(``search_rl/main_*.py`` and the ``search_rl/demo/`` package: they sit on top and know every concrete class); the
module-level imports of ``search_rl`` and ``retriever_server``, those under ``if TYPE_CHECKING:`` included, have no
cycle; the search backends (``search_rl/rollout/backends/``) import nothing of the rollout above them; the engine
kinds (``search_rl/rollout/engines/{hf,static,vllm}/``) do not import each other; and the retriever's core (corpus,
index, retrievers, identity, settings) never imports its HTTP layer (``retriever_server/api/``).

Run: python -m pytest tests/search_rl/test_import_directions.py -q
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


ENTRY_POINTS = sorted(["search_rl.demo", *(f"search_rl.{p.stem}" for p in (REPO / "search_rl").glob("main_*.py"))])
"""The modules ``python -m`` runs, and the demo's package (an entry point in rooms, every module of it one); nothing
else imports them."""


def _is_entry_point(module: str) -> bool:
    return any(module == e or module.startswith(e + ".") for e in ENTRY_POINTS)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    """Modules the import statements among ``nodes`` name; ``from a import b`` names ``a`` and ``a.b`` (``b`` may be a
    module)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _imported_modules(path: Path) -> set[str]:
    """Every import of the file, also those inside functions."""
    return _names(ast.walk(ast.parse(path.read_text(), filename=str(path))))


def _module_level_imports(path: Path) -> set[str]:
    """The module-level imports: also inside ``if`` / ``try`` and under ``if TYPE_CHECKING:`` (an annotation is a
    dependency too: a type-only back-arrow is a cycle a reader has to untangle), not inside functions or classes."""

    def statements(body: list[ast.stmt]) -> Iterable[ast.stmt]:
        for node in body:
            yield node
            if isinstance(node, ast.If):
                yield from statements(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                yield from statements(node.body + [s for h in node.handlers for s in h.body] + node.orelse)
                yield from statements(node.finalbody)

    return _names(statements(ast.parse(path.read_text(), filename=str(path)).body))


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


def test_no_module_imports_an_entry_point():
    # entry points may drive each other (the demo runs main_ppo's stages); scripts (bench/, tests) may call them
    offenders = sorted(
        {
            f"{path.relative_to(REPO)} imports {name}"
            for package in ("search_rl", "retriever_server", "data_prep")
            for path in (REPO / package).rglob("*.py")
            if not _is_entry_point(_module_name(path))
            for name in _imported_modules(path)
            if _is_entry_point(name)
        }
    )
    assert not offenders, f"move what they need out of the entry point into its package: {offenders}"


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (module -> modules it imports), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def _import_graph(packages: Iterable[str]) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` its module-level imports name (``_module_level_imports``)."""
    paths = {_module_name(p): p for package in packages for p in (REPO / package).rglob("*.py")}
    return {m: {n for n in _module_level_imports(p) if n in paths and n != m} for m, p in paths.items()}


def test_module_level_imports_have_no_cycle():
    cycle = _cycle(_import_graph(["search_rl", "retriever_server"]))
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


BACKENDS = "search_rl.rollout.backends"
LAZY_BACKEND_IMPORTS = {f"{BACKENDS}.simulated": ("search_rl.rollout.engines.factory",)}
"""Imports of the rollout a backend may make inside a function: the simulated backend builds its writer model (an HF
engine, through the one engine builder) on first use."""


def test_search_backends_import_nothing_of_the_rollout_above_them():
    # the agent loop calls the backends, never the reverse; what they share lives in search_rl.datatypes / config
    offenders = []
    for path in (REPO / "search_rl/rollout/backends").rglob("*.py"):
        module, top = _module_name(path), _module_level_imports(path)
        for name in sorted(_imported_modules(path)):
            if not _within(name, "search_rl.rollout") or _within(name, BACKENDS):
                continue
            lazy_ok = any(_within(name, allowed) for allowed in LAZY_BACKEND_IMPORTS.get(module, ()))
            if name in top or not lazy_ok:
                offenders.append(f"{path.relative_to(REPO)} imports {name}")
    assert not offenders, f"move what a backend needs into {BACKENDS} (or datatypes / config): {offenders}"


ENGINES = "search_rl.rollout.engines"
ENGINE_KINDS = tuple(
    f"{ENGINES}.{p.name}"
    for p in sorted((REPO / "search_rl/rollout/engines").iterdir())
    if p.is_dir() and (p / "__init__.py").exists()
)
"""The engine subpackages, one per kind (``hf``, ``static``, ``vllm``)."""
SHARED_ENGINE_HELPERS = tuple(f"{ENGINES}.{m}" for m in ("base", "decoding", "in_process", "prefix_cache"))
"""What the kinds share: none of it imports a kind (``choice`` and ``factory`` know every kind)."""


def test_engine_kinds_do_not_import_each_other():
    # a kind may use the contract and the shared helpers of rollout/engines/, never another kind; nor may the helpers
    assert {k.rsplit(".", 1)[1] for k in ENGINE_KINDS} == {"hf", "static", "vllm"}
    offenders = []
    for path in (REPO / "search_rl/rollout/engines").rglob("*.py"):
        module = _module_name(path)
        mine = next((k for k in ENGINE_KINDS if _within(module, k)), None)
        if mine is None and module not in SHARED_ENGINE_HELPERS:
            continue
        for name in sorted(_imported_modules(path)):
            if any(_within(name, k) for k in ENGINE_KINDS if k != mine):
                offenders.append(f"{path.relative_to(REPO)} imports {name}")
    assert not offenders, f"move what two engine kinds share into {ENGINES} (base, decoding, ...): {offenders}"


RETRIEVER_SERVICE = (
    "retriever_server.api",
    "retriever_server.serve",
    "retriever_server.app",
    "retriever_server.__main__",
)
"""The retriever's service layers and entry points; every other module of ``retriever_server`` is its core."""


def test_the_retrievers_core_does_not_import_its_http_layer():
    offenders = sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in (REPO / "retriever_server").rglob("*.py")
        if not any(_within(_module_name(path), layer) for layer in RETRIEVER_SERVICE)
        for name in _imported_modules(path)
        if _within(name, "retriever_server.api")
    )
    assert not offenders, f"move what the core needs out of retriever_server/api/: {offenders}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


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
    module.write_text(
        "import os\nfrom data_prep.synth_sft import read_input\nfrom . import x\n"
        "def f():\n    from search_rl import main_eval\n"
        "if TYPE_CHECKING:\n    import typing_only\n"
    )
    assert _imported_modules(module) == {
        "os",
        "data_prep.synth_sft",
        "data_prep.synth_sft.read_input",
        "search_rl",
        "search_rl.main_eval",
        "typing_only",
    }
    assert _module_level_imports(module) == {
        "os",
        "data_prep.synth_sft",
        "data_prep.synth_sft.read_input",
        "typing_only",
    }
