"""``model.attn_implementation``: the trainer's passes run the attention it resolves to, the engine keeps SDPA, and
eager attention computes what SDPA computes.

Run: python -m pytest tests/search_rl/workers/test_trainer_attention.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close
from worker_factory import StepCapture, gradient_terms, logprob_terms, make_actor, make_critic, response_logprob_scale

from search_rl.config import ModelConfig
from search_rl.config.loading import ConfigError
from search_rl.models.trainer_attention import resolve_trainer_attention


@pytest.mark.parametrize(
    ("device", "dtype", "want"),
    [
        ("cpu", torch.bfloat16, "eager"),  # CPU SDPA gains nothing from bf16; eager's matmuls do
        ("cpu", torch.float32, "sdpa"),  # measured the same: SDPA kept
        ("cuda", torch.bfloat16, "sdpa"),  # fused kernels
        ("cuda", torch.float32, "sdpa"),
    ],
)
def test_auto_picks_eager_only_for_bf16_on_a_cpu(device, dtype, want):
    assert resolve_trainer_attention("auto", device, dtype)[0] == want
    other = "sdpa" if want == "eager" else "eager"
    assert resolve_trainer_attention(other, device, dtype) == (other, f"model.attn_implementation={other}")


def test_an_unknown_attention_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"model\.attn_implementation must be one of .*'flash'"):
        ModelConfig(attn_implementation="flash")


def _attention(model: torch.nn.Module) -> str:
    return model.config._attn_implementation


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_the_trainer_runs_eager_in_bf16_on_cpu_and_the_engine_keeps_sdpa(lora_rank):
    bf16 = make_actor(dtype="bfloat16", lora_rank=lora_rank)
    assert bf16.attn_implementation == "eager"
    assert _attention(bf16.policy) == "eager"
    if bf16.reference is not None:
        assert _attention(bf16.reference) == "eager"
    assert _attention(bf16.engine_model) == "sdpa"
    assert make_actor(dtype="float32", lora_rank=lora_rank).attn_implementation == "sdpa"
    assert make_actor(dtype="float32", lora_rank=lora_rank, attn="eager").attn_implementation == "eager"
    assert _attention(make_critic(dtype="bfloat16").value_model.backbone) == "eager"
    assert _attention(make_critic(dtype="float32").value_model.backbone) == "sdpa"


@pytest.mark.slow
def test_eager_attention_gives_sdpas_log_probs_and_gradients(rollout_batch):
    """float32, shared prompts on (a prompt's KV cache extended by the responses' pass), left-padded prompts and
    response padding: the two implementations differ only in summation order."""
    workers = {}
    for attn in ("sdpa", "eager"):
        workers[attn] = make_actor(micro=2, mini=2, attn=attn)
        workers[attn].init_distributed("127.0.0.1", 0)
    sdpa, eager = workers["sdpa"], workers["eager"]
    assert (rollout_batch.attention_mask[:, : rollout_batch.prompt_length] == 0).any(), "prompts should be padded"
    n, scale = logprob_terms(rollout_batch), response_logprob_scale(sdpa.module, rollout_batch)
    old = sdpa.compute_log_prob(rollout_batch)[0]
    assert_reordered_close(eager.compute_log_prob(rollout_batch)[0], old, n, scale=scale)
    assert_reordered_close(
        eager.compute_ref_log_prob(rollout_batch), sdpa.compute_ref_log_prob(rollout_batch), n, scale=scale
    )
    steps = {name: StepCapture(worker) for name, worker in workers.items()}
    for worker in workers.values():
        worker.update_actor(rollout_batch, step=1)
    assert len(steps["sdpa"].grads) == len(steps["eager"].grads) > 0
    for a, b, terms in zip(steps["eager"].grads, steps["sdpa"].grads, steps["sdpa"].terms, strict=True):
        assert_reordered_close(a, b, gradient_terms(rollout_batch), scale=terms)
