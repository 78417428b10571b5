"""Fixtures of the search_rl tests: the SmolLM2 tokenizer, the tiny random Llama, and helpers that drive a real model.

``ScriptedLogits`` (``scripted_logits.py``) makes a real transformers model (the tiny random Llama) write scripted
turns: the HF engine runs its normal batched, KV-cached decode and sampling, but the logits are pushed towards the
scripted next token. So the agent loop is exercised end to end with deterministic, readable model output.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import pytest
import torch
from scripted_logits import ScriptedLogits

from search_rl.datatypes import Generated, SamplingParams
from search_rl.models import build_tiny_model, compute_dtype, load_tokenizer
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.engines.hf import HFEngine

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session", autouse=True)
def cpu_without_amx() -> Iterator[None]:
    """``model.dtype=auto`` resolves as on a CPU without AMX or AVX512-BF16 (float32) in this process, so the float32
    tests' tolerances hold on bf16-capable machines too; the bf16 tests name ``bfloat16`` or stub the machine themselves
    (``models/test_compute_dtype.py``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compute_dtype, "cpu_flags", frozenset)
        yield


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (extracted from the packaged GGUF once, then cached)."""
    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """A 2-layer, 64-wide random Llama with SmolLM2's vocabulary (shared: do not change its weights)."""
    return build_tiny_model(tokenizer, seed=0)


@pytest.fixture
def tiny_engine(tiny_model, tokenizer) -> HFEngine:
    return HFEngine(tiny_model, tokenizer)


class RecordingEngine:
    """Wraps an engine and records every call and result, to compare trajectories with what was sampled."""

    def __init__(self, inner: HFEngine, after_call=None) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams, list[Generated]]] = []
        self.after_call = after_call

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.inner.eos_token_ids

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def generate(self, prompts, params, max_new_tokens=None) -> list[Generated]:
        out = self.inner.generate(prompts, params, max_new_tokens)
        self.calls.append(([list(p) for p in prompts], params, out))
        if self.after_call is not None:
            self.after_call(len(self.calls))
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.inner.update_weights(named_tensors, version)


@pytest.fixture
def make_scripted_engine(tiny_model, tokenizer):
    """Factory: ``(scripts: {prompt ids: [turn texts]}, after_call=None) -> RecordingEngine`` over the tiny model."""

    def make(scripts: dict[tuple[int, ...], Sequence[str]], after_call=None) -> RecordingEngine:
        engine = HFEngine(tiny_model, tokenizer, logits_processor=ScriptedLogits(tokenizer, scripts))
        return RecordingEngine(engine, after_call)

    return make


@pytest.fixture
def make_scripted_hf(tiny_model, tokenizer):
    """Factory: ``scripts -> HFEngine`` over the tiny model, unwrapped (so the agent loop can open sessions on it)."""
    return lambda scripts: HFEngine(tiny_model, tokenizer, logits_processor=ScriptedLogits(tokenizer, scripts))


@pytest.fixture
def make_prompt(tokenizer):
    """Factory: ``question -> prompt ids`` (a short chat prompt in SmolLM2's template)."""
    return lambda question: encode_prompt(tokenizer, [{"role": "user", "content": f"Search, then answer: {question}"}])


@pytest.fixture
def recording():
    """Factory: ``(engine, after_call=None) -> RecordingEngine`` wrapping any engine."""
    return RecordingEngine


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray for the tests marked ``ray`` (2 CPUs, no dashboard), started once and shut down at the end.

    Workers ask for fractional CPUs (``trainer.cpus_per_worker``), so an actor and a critic group of two each fit.
    """
    import ray

    if not ray.is_initialized():
        # address="local": always a cluster of this process's own, never one another test (or a parallel test
        # worker) started with ``ray start`` on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
