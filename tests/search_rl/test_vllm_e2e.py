"""vLLM (the CPU build) end to end, against a real BM25 retriever server:

- ``main_ppo`` with ``rollout=vllm``: GRPO for 2 steps on Ray; the engine samples step 2 with the weights step 1
  trained (synced through /dev/shm + an in-place reload), and the trainer's recomputed log-probs of those samples
  match vLLM's own within 1e-3 (float32 on both sides): the synced weights are the trained ones.
- ``trainer.mode=async`` with one vLLM generator actor pulling the weights by version.
- ``main_eval`` with vLLM: the same greedy trajectories as the HF engine on the same model.

The policy is a 2-layer random Llama 256 wide, saved as an HF folder (vLLM's CPU attention needs head_dim 64; the
``tiny`` model's is 16); a checksum reward varies within groups so that the advantages are not all zero.

Run: .venv-vllm/bin/python -m pytest tests/search_rl/test_vllm_e2e.py -q   (make install-vllm first; ~4 min)
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from checksum_reward import CHECKSUM_REWARD

from search_rl.configure import load_config
from search_rl.main_eval import evaluate, load_eval_config
from search_rl.main_ppo import run
from search_rl.models import build_tiny_model, load_model
from search_rl.tracking.jsonl import read_jsonl

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.slow, pytest.mark.integration]
pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

VLLM = ("rollout=vllm", "actor_rollout_ref.rollout.vllm.kv_cache_gib=0.25")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("policy")
    build_tiny_model(tokenizer, seed=0, hidden_size=256).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _train_overrides(run_dir: Path, policy: Path, url: str, *extra: str) -> list[str]:
    return [
        f"model.path={policy}",
        "algorithm=grpo",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"retriever.url={url}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.n_workers=1",
        "trainer.torch_threads_per_worker=1",
        "trainer.cpus_per_worker=0.25",
        "trainer.logger=[jsonl]",
        "trainer.max_ckpt_to_keep=0",
        "trainer.worker_timeout_s=300",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.total_training_steps=2",
        "do_search=true",
        "max_turns=2",
        "actor_rollout_ref.rollout.max_turn_tokens=24",
        "actor_rollout_ref.rollout.max_obs_tokens=96",
        "actor_rollout_ref.rollout.max_response_tokens=160",
        f"reward.default={CHECKSUM_REWARD}",
        f"+reward.by_data_source.nq={CHECKSUM_REWARD}",
        f"+reward.by_data_source.hotpotqa={CHECKSUM_REWARD}",
        *VLLM,
        *extra,
    ]


def test_grpo_with_vllm_trains_and_samples_with_the_synced_weights(ray_local, retriever_url, policy_dir, tmp_path):
    extra = ("trainer.save_freq=2", "actor_rollout_ref.actor.old_logprobs=recompute")
    cfg = load_config(_train_overrides(tmp_path, policy_dir, retriever_url, *extra))
    assert cfg.actor_rollout_ref.rollout.engine == "vllm"
    history = dict(run(cfg))
    assert sorted(history) == [1, 2]
    for step, m in history.items():
        assert math.isfinite(m["actor/loss"]), step
        assert m["rollout/weight_version"] == step - 1
    assert history[2]["rollout/logprob_abs_diff"] < 1e-3, "vLLM sampled step 2 with other weights than the trainer's"
    trained = load_model(str(tmp_path / "global_step_2"))
    start = load_model(str(policy_dir))
    assert any(not torch.equal(trained.state_dict()[k], v) for k, v in start.state_dict().items())


def test_async_mode_with_a_vllm_generator(ray_local, retriever_url, policy_dir, tmp_path):
    mode = ("trainer.mode=async", "trainer.max_staleness=0", "trainer.n_generators=1")
    history = dict(run(load_config(_train_overrides(tmp_path, policy_dir, retriever_url, *mode))))
    assert sorted(history) == [1, 2]
    assert [history[s]["rollout/weight_version"] for s in (1, 2)] == [0, 1]
    assert all(math.isfinite(m["actor/loss"]) for m in history.values())


def test_main_eval_with_vllm_matches_the_hf_engine(retriever_url, policy_dir, tmp_path):
    small = [
        f"model.path={policy_dir}",
        "data.max_samples=3",
        "max_turns=1",
        "actor_rollout_ref.rollout.max_turn_tokens=16",
        f"retriever.url={retriever_url}",
    ]
    results = {}
    for engine in ("hf", "vllm"):
        extra = [f"actor_rollout_ref.rollout.engine={engine}", "actor_rollout_ref.rollout.vllm.kv_cache_gib=0.25"]
        result = evaluate(load_eval_config([*small, *extra, f"output_dir={tmp_path / engine}"]))
        results[engine] = [r["response"] for r in read_jsonl(result.output_dir / "trajectories.jsonl")]
    assert len(results["vllm"]) == 3
    assert results["vllm"] == results["hf"]
