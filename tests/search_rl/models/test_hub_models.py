"""Models named the way users name them: a hub id (``org/name``) resolves to its snapshot in the HF cache, offline
(``HF_HUB_OFFLINE=1``), for the model, the tokenizer and the context length; an id missing from the cache is an error
that says so. The cache is populated by the test (a tiny random Llama in the hub's cache layout).

Run: python -m pytest tests/search_rl/models/test_hub_models.py -q
"""

from __future__ import annotations

import pytest
import torch
from huggingface_hub import constants

from search_rl.models import build_tiny_model, load_model, load_tokenizer
from search_rl.models.loading import model_context_length

REPO = "test-org/tiny-search-policy"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, tokenizer):
    """An HF hub cache holding ``REPO`` at ``REVISION`` (refs/main points at it), with the hub switched offline."""
    repo_dir = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / REVISION
    model = build_tiny_model(tokenizer, seed=5)
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return model


def test_a_hub_id_loads_from_the_cache_offline(offline_cache, tokenizer):
    model = load_model(REPO)
    for name, tensor in offline_cache.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)  # the saved bytes, read back
    assert load_tokenizer(REPO).encode("Who wrote Hamlet?") == tokenizer.encode("Who wrote Hamlet?")
    assert model_context_length(REPO, tokenizer) == offline_cache.config.max_position_embeddings


def test_a_hub_id_missing_from_the_cache_says_so(offline_cache):
    with pytest.raises(FileNotFoundError, match="not in the HF cache"):
        load_model("test-org/not-downloaded")


def test_a_missing_local_path_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError, match="hub id"):
        load_model(str(tmp_path / "no-such" / "folder"))
