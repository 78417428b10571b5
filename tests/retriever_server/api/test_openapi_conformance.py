"""The server against its own OpenAPI document: a bounded schemathesis run (every check, positive and negative
data) against a real uvicorn server: ``python -m pytest tests/retriever_server/api/test_openapi_conformance.py``.

Issue 16 found the document and the server disagreeing: ``[""]`` allowed by the schema but refused, a 400 nobody
documented, ``/metrics`` declared JSON. A disagreement now fails this test with schemathesis's report, which names
the request that shows it (``Test Case ID`` and a curl command to reproduce it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 40
"""Test cases per operation and phase; the run takes about 10-20 s on 2 cores."""


def test_schemathesis_finds_no_disagreement(retriever_url: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{retriever_url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "1",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--no-color",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout and "3 selected" in done.stdout, done.stdout[-3000:]
