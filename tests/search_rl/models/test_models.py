"""Model loading: tiny random model determinism, local HF dirs, the GGUF cache key; SmolLM2 conversion (slow).

Run: python -m pytest tests/search_rl/models/test_models.py -q            (fast)
     python -m pytest tests/search_rl/models/test_models.py -q -m slow    (converts SmolLM2 once into the cache)
"""

from __future__ import annotations

import pytest
import torch

from search_rl.models import SMOLLM2, build_tiny_model, load_model, load_tokenizer
from search_rl.models.loading import _cache_dir, gguf_model_dir, smollm2_gguf_path


def test_tiny_model_is_deterministic_and_leaves_rng_alone(tokenizer):
    state = torch.random.get_rng_state()
    a, b, c = (build_tiny_model(tokenizer, seed=s) for s in (0, 0, 1))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.vocab_size == len(tokenizer) and a.config.num_hidden_layers == 2


def test_local_directory_round_trip(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    ids = torch.tensor([tokenizer.encode("hello world")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert load_tokenizer(str(tmp_path)).encode("hello") == tokenizer.encode("hello")


def test_unknown_source_is_a_clear_error(tmp_path):
    expected = "not 'smollm2-135m-instruct', 'tiny', a .gguf file, a local HF directory with config.json, or a hub id"
    with pytest.raises(FileNotFoundError, match=expected):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))


def test_cache_key_follows_file_content(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"one")
    first = _cache_dir(f)
    f.write_bytes(b"two")
    assert _cache_dir(f) != first and str(first).startswith(str(tmp_path / "cache" / "search-rl" / "models"))


def test_tokenizer_of_packaged_model(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id is not None
    assert smollm2_gguf_path().name.endswith(".gguf")


@pytest.mark.slow
def test_smollm2_converted_once_and_cached():
    path = gguf_model_dir(smollm2_gguf_path())
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    model = load_model(SMOLLM2)
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert gguf_model_dir(smollm2_gguf_path()) == path


def test_cache_keyword_fills_the_cache_without_deprecation_warnings(tiny_model, tokenizer):
    """The KV cache goes in under the installed transformers' own keyword: filled, and no FutureWarning raised."""
    import warnings

    from transformers import DynamicCache

    from search_rl.datatypes import SamplingParams
    from search_rl.models.loading import CACHE_KWARG
    from search_rl.rollout.engines.hf import HFEngine

    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    cache = DynamicCache(config=tiny_model.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.inference_mode():
            tiny_model(input_ids=ids, use_cache=True, **{CACHE_KWARG: cache})
        out = HFEngine(tiny_model, tokenizer).generate([ids[0].tolist()], SamplingParams(max_new_tokens=4, greedy=True))
    assert cache.get_seq_length() == ids.shape[1]
    assert 1 <= len(out[0].token_ids) <= 4
