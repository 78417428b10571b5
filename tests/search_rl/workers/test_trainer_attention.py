"""``model.attn_implementation``: the trainer's passes run the attention asked for (SDPA by default), the engine
keeps SDPA, and eager attention computes what SDPA computes.

Run: python -m pytest tests/search_rl/workers/test_trainer_attention.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close
from worker_factory import StepCapture, gradient_terms, logprob_terms, make_actor, make_critic, response_logprob_scale

from search_rl.config import ModelConfig
from search_rl.config.loading import ConfigError


@pytest.mark.parametrize("name", ["flash", "auto"])
def test_an_unknown_attention_is_refused_by_name(name):
    with pytest.raises(ConfigError, match=rf"model\.attn_implementation must be one of .*'{name}'"):
        ModelConfig(attn_implementation=name)


def _attention(model: torch.nn.Module) -> str:
    return model.config._attn_implementation


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_trainer_runs_the_attention_asked_for_and_the_engine_keeps_sdpa(lora_rank, dtype):
    assert ModelConfig().attn_implementation == "sdpa"
    for attn in ("sdpa", "eager"):
        actor = make_actor(dtype=dtype, lora_rank=lora_rank, attn=attn)
        assert actor.attn_implementation == attn
        assert _attention(actor.policy) == attn
        if actor.reference is not None:
            assert _attention(actor.reference) == attn
        assert _attention(actor.engine_model) == "sdpa"
        assert _attention(make_critic(dtype=dtype, attn=attn).value_model.backbone) == attn


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
