"""What the tools that turn a ``main_eval`` run's sampled records into a parquet share (``rft_rows``,
``filter_prompts``): reading the records, the arguments both command lines take, and the manifest next to the
output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from search_rl.tools.compare_evals import run_folder
from search_rl.tracking.jsonl import read_jsonl


def read_records(folder: Path) -> list[dict[str, Any]]:
    """The records of a ``main_eval`` run folder (or the newest run in ``folder``)."""
    return read_jsonl(run_folder(folder) / "trajectories.jsonl")


def records_parser(
    module: str, description: str | None, records_help: str, min_rows_help: str
) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>`` with the arguments every records tool takes: ``--records`` (repeatable,
    to pool runs), ``--questions``, ``--output`` and ``--min-rows``; the tool adds its own."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {module}", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", required=True, type=Path, action="append", help=records_help)
    ap.add_argument("--questions", required=True, type=Path, help="the question parquet that evaluation read")
    ap.add_argument("--output", required=True, type=Path, help="output parquet; the manifest goes next to it")
    ap.add_argument("--min-rows", type=int, default=1, help=min_rows_help)
    return ap


def write_manifest(output: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` to ``<output stem>.manifest.json`` beside the output parquet; returns its path."""
    path = output.with_name(output.stem + ".manifest.json")
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path
