"""``main_sft`` end to end on CPU: the tiny random Llama learns real warm-start examples (a real BM25 retriever
validates), writes the RL trainer's checkpoints, resumes, and ``main_ppo`` / ``main_eval`` start from its output.

Run: python -m pytest tests/search_rl/sft/test_main_sft.py -q
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from numerics import reorder_tol

from search_rl.config import ConfigError
from search_rl.configure import load_config
from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.main_ppo import prepare as prepare_ppo
from search_rl.main_sft import build_actor, build_trainer, load_sft_config, prepare, train
from search_rl.models import load_model, load_tokenizer, model_context_length
from search_rl.workers.actor_rollout_ref import ActorRolloutRefWorker
from search_rl.workers.forward import response_logprobs

pytestmark = pytest.mark.integration


def _overrides(sft_parquet, url, run_dir, *extra):
    return [
        "model=tiny",
        f"data.train_files=[{sft_parquet}]",
        f"retriever.url={url}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.torch_threads_per_worker=1",
        "trainer.max_ckpt_to_keep=0",
        "data.train_batch_size=4",
        "data.val_max_samples=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=3e-3",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "max_turns=2",
        "actor_rollout_ref.rollout.max_turn_tokens=48",
        "actor_rollout_ref.rollout.max_obs_tokens=256",
        "actor_rollout_ref.rollout.max_response_tokens=512",
        *extra,
    ]


def test_the_loss_is_the_nll_of_model_tokens_only(sft_parquet, retriever_url, tmp_path):
    cfg = load_sft_config(_overrides(sft_parquet, retriever_url, tmp_path, "trainer.test_freq=0"))
    prepared = prepare(cfg)
    actor = build_actor(cfg, "cpu", local=True)
    batch = prepared.dataset.batch([0, 1, 2, 3])
    with torch.no_grad():
        logprobs, _ = response_logprobs(actor.worker.policy, batch, 1.0)
    model_only = -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()
    every_token = -(logprobs * batch.response_attention_mask).sum() / batch.response_attention_mask.sum()
    m = actor.map_shards(ActorRolloutRefWorker.update_sft, batch)[0]
    # the update's micro-batched passes sum the same terms in another order: a mean over the batch's tokens
    assert m["sft/nll"] == pytest.approx(float(model_only), rel=reorder_tol(int(batch.attention_mask.sum())))
    assert abs(float(every_token) - float(model_only)) > 1e-3, "the two masks must give different losses here"
    assert m["perf/sft_loss_tokens"] == float(batch.response_mask.sum()) and m["actor/grad_norm"] > 0


def test_warm_start_learns_checkpoints_resumes_and_feeds_rl(sft_parquet, retriever_url, tmp_path):
    run_dir = tmp_path / "sft"
    over = _overrides(sft_parquet, retriever_url, run_dir, "trainer.save_freq=4", "trainer.test_freq=4")
    cfg = load_sft_config([*over, "trainer.total_training_steps=4"])
    prepared = prepare(cfg)
    history = dict(build_trainer(cfg, prepared, build_actor(cfg, "cpu", local=True)).fit())
    prepared.tracker.close()
    nll = [history[s]["sft/nll"] for s in (1, 2, 3, 4)]
    assert all(math.isfinite(x) for x in nll)
    assert nll[2] < nll[0] and nll[3] < nll[1], f"the same examples (2 batches) must get likelier: {nll}"
    assert history[4]["train/epoch"] == pytest.approx(2.0)
    assert "val/all/em" in history[4] and "val/nq/answer_rate" in history[4] or "val/hotpotqa/answer_rate" in history[4]
    ckpt = run_dir / "global_step_4"
    assert (ckpt / "actor" / "config.json").is_file() and (ckpt / "actor_optim.pt").is_file()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]

    # resume: a longer run continues at step 5 from the checkpoint
    cfg2 = load_sft_config([*over, "trainer.total_training_steps=5"])
    prepared2 = prepare(cfg2)
    history2 = dict(build_trainer(cfg2, prepared2, build_actor(cfg2, "cpu", local=True)).fit())
    prepared2.tracker.close()
    assert sorted(history2) == [5] and history2[5]["sft/nll"] < nll[0]

    # the checkpoint folder is a model source for RL and evaluation (its actor/ is loaded)
    trained = load_model(str(ckpt))
    assert not torch.equal(trained.model.embed_tokens.weight, load_model("tiny").model.embed_tokens.weight)
    assert model_context_length(str(ckpt), load_tokenizer(str(ckpt))) > 0
    ppo = load_config(["algorithm=grpo", f"model.path={ckpt}", f"retriever.url={retriever_url}", "trainer.logger=[]"])
    assert len(prepare_ppo(ppo).train_loader.dataset) > 0
    ev = load_eval_config(
        [
            f"model.path={ckpt}",
            f"retriever.url={retriever_url}",
            "data.max_samples=2",
            f"output_dir={tmp_path}/eval",
            "actor_rollout_ref.rollout.max_turn_tokens=16",
            "max_turns=1",
        ]
    )
    assert evaluate(ev).summary.startswith("eval n=2 ")


def test_config_errors_before_anything_starts(sft_parquet, retriever_url, tmp_path):
    with pytest.raises(ConfigError, match="trainer.n_workers=2"):
        prepare(
            load_sft_config(
                _overrides(sft_parquet, retriever_url, tmp_path, "data.train_batch_size=3", "trainer.n_workers=2")
            )
        )
    with pytest.raises(ValueError, match="max_turn_tokens"):
        prepare(
            load_sft_config(
                _overrides(sft_parquet, retriever_url, tmp_path, "actor_rollout_ref.rollout.max_response_tokens=8")
            )
        )
    with pytest.raises(Exception, match="no_such_key"):
        load_sft_config(["+no_such_key=1"])


@pytest.mark.ray
@pytest.mark.slow
def test_two_data_parallel_workers_on_ray(ray_local, sft_parquet, retriever_url, tmp_path):
    over = _overrides(
        sft_parquet,
        retriever_url,
        tmp_path,
        "trainer.n_workers=2",
        "trainer.cpus_per_worker=0.25",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.test_freq=0",
        "trainer.worker_timeout_s=300",
    )
    cfg = load_sft_config(over)
    history = dict(train(cfg, prepare(cfg)))
    assert sorted(history) == [1, 2] and history[2]["sft/nll"] < history[1]["sft/nll"] + 1.0
    assert history[1]["perf/actor_update_tokens"] > 0 and (tmp_path / "global_step_2" / "actor").is_dir()
