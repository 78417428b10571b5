"""What each stage's entry point is told: the Hydra overrides of the warm start (``main_sft``), RL (``main_ppo``)
and evaluation (``main_eval``), all sharing one search loop and its budgets."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from search_rl.demo.settings import RL_QUESTIONS, TURN_TOKENS, DemoSettings


def budget_overrides(s: DemoSettings, retriever_url: str) -> list[str]:
    """The compute dtype, search loop and budgets every stage shares (training and evaluation alike)."""
    return [
        f"model.dtype={s.dtype}",
        f"retriever.url={retriever_url}",
        f"max_turns={s.max_turns}",
        f"actor_rollout_ref.rollout.max_turn_tokens={TURN_TOKENS}",
        f"actor_rollout_ref.rollout.max_obs_tokens={s.max_obs_tokens}",
        f"actor_rollout_ref.rollout.max_response_tokens={s.max_response_tokens}",
    ]


def _loop(s: DemoSettings, stage: str, steps: int, fresh: bool) -> list[str]:
    logger_names = "jsonl,tensorboard" if importlib.util.find_spec("tensorboard") else "jsonl"
    return [
        f"trainer.default_local_dir={s.stage_dir(stage)}",
        f"trainer.experiment_name=demo_{stage}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
        "trainer.test_freq=0",
        "trainer.max_ckpt_to_keep=1",
        f"trainer.logger=[{logger_names}]",
        f"trainer.resume={'disable' if fresh else 'auto'}",
        f"trainer.seed={s.seed}",
        # every worker gets all cores: the loop's phases never compute at the same time
        f"trainer.torch_threads_per_worker={os.cpu_count() or 1}",
    ]


def sft_overrides(s: DemoSettings, retriever_url: str, fresh: bool = False) -> list[str]:
    """``main_sft`` overrides: a few steps at a high learning rate teach the search protocol (docs/learning.md)."""
    model = ["model=tiny"] if s.model == "tiny" else []
    return [
        *model,
        *_loop(s, "sft", s.sft_steps, fresh),
        f"data.train_batch_size={s.sft_batch}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        *budget_overrides(s, retriever_url),
    ]


def train_overrides(s: DemoSettings, retriever_url: str, start: Path, fresh: bool = False) -> list[str]:
    """``main_ppo`` overrides of the RL stage: GRPO on ``RL_QUESTIONS`` from the warm start ``start`` (a checkpoint
    folder) with LoRA adapters (rank 16 at lr 1e-4: a cheaper update than full weights, which at learning.md row 8's
    lr did no better in three steps, docs/experiments/2026-11-29-demo-rl-full-weights.md), mini-batches of half the
    prompts (at least one: several optimizer steps per batch), F1 partial credit so groups of wrong answers still
    differ, no KL term (no reference pass), and dynamic sampling over up to ``s.gen_batches`` generation batches per
    step."""
    filtering = (
        ["algorithm.filter_groups.enable=true", f"algorithm.filter_groups.max_num_gen_batches={s.gen_batches}"]
        if s.gen_batches > 1
        else []
    )
    return [
        "algorithm=grpo",
        f"model.path={start}",
        *_loop(s, "rl", s.steps, fresh),
        f"data.train_files=[{RL_QUESTIONS}]",
        f"data.train_batch_size={s.prompts}",
        f"actor_rollout_ref.rollout.n={s.group_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, s.prompts // 2)}",
        "model.lora_rank=16",
        "model.lora_alpha=32",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "reward.partial_credit=f1",
        "reward.partial_credit_weight=0.5",
        "algorithm.use_kl_loss=false",
        *filtering,
        *budget_overrides(s, retriever_url),
    ]


def eval_overrides(s: DemoSettings, retriever_url: str, stage: str, checkpoint: Path | None) -> list[str]:
    """``main_eval`` overrides: greedy, with search, on a seeded slice of the shipped test split (the same questions
    for every stage); ``checkpoint`` None evaluates the base model."""
    if checkpoint is not None:
        model = [f"model.path={checkpoint / 'actor'}"]
    else:
        model = ["model=tiny"] if s.model == "tiny" else []
    return [
        *model,
        f"data.max_samples={s.eval_samples}",
        f"output_dir={s.run_dir / 'eval' / stage}",
        *budget_overrides(s, retriever_url),
    ]
