"""Settings from the environment, and their documentation:
``python -m pytest tests/retriever_server/test_settings.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from retriever_server.settings import Method, Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_env_vars_set_fields(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRIEVER_METHOD", "hybrid")
    monkeypatch.setenv("RETRIEVER_DEFAULT_TOPK", "5")
    monkeypatch.setenv("RETRIEVER_INDEX_DIR", str(tmp_path))
    s = Settings()
    assert s.method is Method.hybrid and s.default_topk == 5 and s.index_dir == tmp_path


def test_bad_values_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVER_METHOD", "splade")
    with pytest.raises(ValidationError, match="method"):
        Settings()
    monkeypatch.delenv("RETRIEVER_METHOD")
    with pytest.raises(ValidationError, match="default_topk=7 is above max_topk=5"):
        Settings(default_topk=7, max_topk=5)


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = README.read_text()
    missing = [
        f"RETRIEVER_{name.upper()}" for name in Settings.model_fields if f"`RETRIEVER_{name.upper()}`" not in readme
    ]
    assert not missing, f"README.md does not document {missing}"
