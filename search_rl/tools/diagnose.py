"""One pasteable environment report for bug reports: ``python -m search_rl.tools.diagnose [--retriever-url URL]``.

Sections: versions (Python, torch, transformers, Ray, FAISS, vLLM and the rest of the stack), hardware (CPU cores,
memory, CUDA devices, the compute dtype ``model.dtype=auto`` picks here and why), Ray (``ray status`` of a running
cluster, if any), the retriever (reachability and the index ``/health`` reports), and the caches (converted models,
built indexes). Never fails: every probe reports its own error. Output is Markdown, so it renders in a GitHub issue.

``--eval PATH`` prints instead the search breakdown of an evaluation: ``main_eval``'s ``metrics.json`` (or its
folder), or a training run's folder (its last validation in ``metrics.jsonl``). Per data source: EM, answer rate,
searches, valid-search and duplicate-query rates, gold retrieved, why answers are wrong (no answer, no search,
retrieval missed, read wrong), EM by number of searches, answer length (``search_rl.reward.search_stats``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import httpx

from retriever_server.serve.ray_cli import ray_cli
from retriever_server.settings import DEFAULT_URL
from search_rl.reward.search_stats import ANSWER_SOURCE_LABELS, ANSWER_SOURCES
from search_rl.tools.compare_evals import run_folder
from search_rl.tracking.jsonl import read_jsonl

logger = logging.getLogger(__name__)

PACKAGES = (
    "search-rl",
    "torch",
    "transformers",
    "ray",
    "faiss-cpu",
    "faiss-gpu",
    "vllm",
    "sentence-transformers",
    "bm25s",
    "fastapi",
    "uvicorn",
    "httpx",
    "pydantic",
    "hydra-core",
    "omegaconf",
    "numpy",
    "pandas",
    "pyarrow",
    "gguf",
    "textual",
    "matplotlib",
    "tensorboard",
    "wandb",
)
"""Distributions whose versions the report lists ("not installed" when absent)."""


def versions() -> list[str]:
    """``- name: version`` lines for Python, the OS and ``PACKAGES``."""
    lines = [f"- python: {sys.version.split()[0]} ({sys.executable})", f"- platform: {platform.platform()}"]
    for name in PACKAGES:
        try:
            lines.append(f"- {name}: {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"- {name}: not installed")
    return lines


def hardware() -> list[str]:
    """CPU cores (machine and usable), memory, and CUDA devices as torch sees them."""
    lines = [
        f"- cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} usable"
    ]
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        lines.append(f"- memory: {pages * size / 2**30:.1f} GiB")
    except (ValueError, OSError, AttributeError):
        lines.append("- memory: unknown")
    try:
        import torch

        lines.append(
            f"- torch threads: {torch.get_num_threads()}; CUDA available: {torch.cuda.is_available()}"
            f" (build {torch.version.cuda or 'cpu'})"
        )
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"- cuda:{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB")
        lines.append(compute_dtype_line("cuda" if torch.cuda.is_available() else "cpu"))
    except Exception as e:  # a broken torch install is exactly what this report must show
        lines.append(f"- torch: cannot import ({type(e).__name__}: {e})")
    return lines


def compute_dtype_line(device: str) -> str:
    """``- compute dtype: <dtype> (<reason>)``: what ``model.dtype=auto`` resolves to on ``device`` of this machine."""
    from search_rl.models.compute_dtype import AUTO, resolve_compute_dtype

    name, reason = resolve_compute_dtype(AUTO, device)
    return f"- compute dtype: {name} ({reason}; model.dtype=auto on this machine's {device})"


def ray_status(timeout_s: float = 30.0) -> list[str]:
    """The output of ``ray status`` for a running cluster, or why there is none."""
    try:
        cmd = ray_cli()  # this interpreter's Ray: PATH may hold another Python's `ray`, or none
    except FileNotFoundError as e:
        return [f"- {e}"]
    try:
        proc = subprocess.run([*cmd, "status"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return [f"- `ray status` did not answer within {timeout_s:.0f}s"]
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return [f"- `ray status` failed: {last[0][:300]} (main_ppo starts a local Ray unless trainer.ray_address)"]
    return ["```", proc.stdout.strip(), "```"]


def retriever(urls: list[str]) -> list[str]:
    """``GET /health`` of each retriever URL: reachable or not, status, index size and backend."""
    lines = []
    for url in urls:
        base = url.rstrip("/").removesuffix("/retrieve")
        try:
            r = httpx.get(f"{base}/health", timeout=5, trust_env=False)
            lines.append(f"- {base}: HTTP {r.status_code} {r.text[:400]}")
        except httpx.HTTPError as e:
            lines.append(
                f"- {base}: not reachable ({type(e).__name__}); start it with "
                "`uvicorn retriever_server.app:app` or `python -m search_rl.demo --serve-only`"
            )
    return lines


def _size(path: Path) -> str:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return f"{total / 2**20:.0f} MiB"


def caches() -> list[str]:
    """Entries of the converted-model cache and the index cache, with sizes."""
    from retriever_server.settings import get_settings
    from search_rl.models.loading import cache_root

    lines = []
    for label, root in (("models", cache_root()), ("indexes", get_settings().index_dir)):
        entries = sorted(p for p in root.glob("*") if p.is_dir()) if root.exists() else []
        lines.append(f"- {label} cache {root}: {len(entries)} entries")
        lines += [f"  - {p.name} ({_size(p)})" for p in entries]
    hf_home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    lines.append(f"- HF_HOME {hf_home}; HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}")
    return lines


def report(retriever_urls: list[str]) -> str:
    """The whole report as Markdown."""
    sections = [
        ("Versions", versions),
        ("Hardware", hardware),
        ("Ray", ray_status),
        ("Retriever", lambda: retriever(retriever_urls)),
        ("Caches", caches),
    ]
    out = ["# search-rl diagnose"]
    for title, probe in sections:
        try:
            body = probe()
        except Exception as e:  # one failing probe must not hide the others
            body = [f"- probe failed: {type(e).__name__}: {e}"]
        out += ["", f"## {title}", *body]
    return "\n".join(out) + "\n"


BREAKDOWN_COLUMNS = (
    ("n", "n", "{:.0f}"),
    ("em", "EM", "{:.3f}"),
    ("answer_rate", "answered", "{:.3f}"),
    ("searches", "searches", "{:.2f}"),
    ("valid_search_rate", "valid search", "{:.3f}"),
    ("duplicate_query_rate", "dup. queries", "{:.3f}"),
    ("gold_retrieved", "gold retrieved", "{:.3f}"),
    ("no_answer", "no answer", "{:.3f}"),
    ("wrong_no_search", "wrong, no search", "{:.3f}"),
    ("retrieval_missed", "retrieval missed", "{:.3f}"),
    ("read_wrong", "read wrong", "{:.3f}"),
    ("answer_words_mean", "answer words", "{:.1f}"),
)
"""``(metric, column header, format)`` of the breakdown table, in order."""


def load_eval_metrics(path: Path) -> dict[str, float]:
    """The metrics of an evaluation: ``metrics.json`` (a file, or the folder holding it, or the ``output_dir`` given
    to ``main_eval``, whose newest run is read), or a training run's last record with validation metrics
    (``<run>/metrics.jsonl``).

    Raises:
        FileNotFoundError: none of these at ``path``, or a training run without validation.
    """
    if path.is_dir() and not (path / "metrics.json").exists() and not (path / "metrics.jsonl").exists():
        try:
            path = run_folder(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no metrics.json or metrics.jsonl at {path}, and no main_eval run (<time>/metrics.json) below it"
            ) from None
    if path.is_dir() and (path / "metrics.json").exists():
        path = path / "metrics.json"
    if path.is_file() and path.suffix == ".json":
        return {k: v for k, v in json.loads(path.read_text()).items() if isinstance(v, int | float)}
    jsonl = path / "metrics.jsonl" if path.is_dir() else path
    if jsonl.is_file():
        records = read_jsonl(jsonl)
        val = [r for r in records if "val/all/n" in r]
        if val:
            return {k: v for k, v in val[-1].items() if isinstance(v, int | float)}
        raise FileNotFoundError(f"{jsonl} has no validation record (val/all/n); set trainer.test_freq")
    raise FileNotFoundError(f"no metrics.json or metrics.jsonl at {path}")


def eval_breakdown(metrics: dict[str, float]) -> list[str]:
    """Markdown tables of the search diagnostics per data source (``<eval|val>/<source>/<metric>`` keys)."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] in ("eval", "val"):
            rows.setdefault(f"{parts[0]}/{parts[1]}", {})[parts[2]] = float(value)
    if not rows:
        return ["- no eval/<source>/* or val/<source>/* metrics found"]
    order = sorted(rows, key=lambda r: (r.endswith("/all"), r))  # sources first, the total last
    lines = [
        "| rows | " + " | ".join(h for _, h, _ in BREAKDOWN_COLUMNS) + " |",
        "|---" * (len(BREAKDOWN_COLUMNS) + 1) + "|",
    ]
    for row in order:
        cells = [fmt.format(rows[row][k]) if k in rows[row] else "-" for k, _, fmt in BREAKDOWN_COLUMNS]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    buckets = (("0", "0"), ("1", "1"), ("2", "2"), ("3plus", "3+"))
    lines += ["", "EM by number of searches (trajectories in brackets):", ""]
    lines += ["| rows | " + " | ".join(f"{label} searches" for _, label in buckets) + " |", "|---" * 5 + "|"]
    for row in order:
        cells = []
        for bucket, _ in buckets:
            n = rows[row].get(f"n_searches_{bucket}")
            em = rows[row].get(f"em_searches_{bucket}")
            cells.append("-" if n is None else f"{em:.3f} ({n:.0f})" if em is not None else f"- ({n:.0f})")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    read_wrong = [row for row in order if rows[row].get("read_wrong") and "read_wrong_gold_passage" in rows[row]]
    if read_wrong:
        lines += ["", "Read wrong, by where the wrong answer came from (shares of all trajectories):", ""]
        headers = [ANSWER_SOURCE_LABELS[s] for s in ANSWER_SOURCES]
        lines += ["| rows | read wrong | " + " | ".join(headers) + " |", "|---" * (len(headers) + 2) + "|"]
        for row in read_wrong:
            r = rows[row]
            cells = [f"{r['read_wrong']:.3f}", *(f"{r[f'read_wrong_{s}']:.3f}" for s in ANSWER_SOURCES)]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    yes_no = [row for row in order if rows[row].get("n_yes_no")]
    if yes_no:
        lines += ["", "Yes/no questions (every gold answer yes or no):", ""]
        lines += ["| rows | questions | EM | answered yes/no |", "|---|---|---|---|"]
        for row in yes_no:
            r = rows[row]
            lines.append(f"| {row} | {r['n_yes_no']:.0f} | {r['em_yes_no']:.3f} | {r['yes_no_answered']:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--retriever-url",
        action="append",
        default=None,
        help=f"retriever base URL to probe (repeatable; default {DEFAULT_URL})",
    )
    ap.add_argument(
        "--eval",
        type=Path,
        default=None,
        metavar="PATH",
        help="print the search breakdown of an evaluation (metrics.json, its folder, main_eval's output_dir, or a "
        "training run folder) instead",
    )
    args = ap.parse_args(argv)
    if args.eval is not None:
        try:
            metrics = load_eval_metrics(args.eval)
        except (FileNotFoundError, ValueError) as e:
            logger.error("%s", e)
            return 2
        body = "\n".join(["# search-rl evaluation breakdown", "", f"`{args.eval}`", "", *eval_breakdown(metrics)])
        sys.stdout.write(body + "\n")
        return 0
    sys.stdout.write(report(args.retriever_url or [DEFAULT_URL]))  # the report is the program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
