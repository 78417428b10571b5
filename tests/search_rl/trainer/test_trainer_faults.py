"""The trainer under faults (issue 16, items 6 and 8): a retriever that goes away during training, and a driver
killed right after it committed a checkpoint.

The loop runs with in-process workers (``build_workers(local=True)``), the tiny random Llama and a real BM25 server
(``python -m retriever_server`` on a free port) that the tests stop. The random model is made to search every turn
by a logits bias (``AlwaysSearch``): the engine still decodes and samples as usual.

- ``on_retriever_error=observe`` with the retriever gone: the circuit breaker stops the run at the first step whose
  searches mostly failed (before, all steps finished with 8 of 8 searches failing, trained on).
- Half the searches of a step fail: the trajectories that saw a failure are left out of the loss and counted
  (``rollout/left_out_retriever_errors``), unless ``train_on_retriever_errors=true``.
- A driver SIGKILLed right after ``global_step_3`` is renamed into place: its step-3 line is in ``metrics.jsonl``, and
  the resumed run continues at step 4 (before: steps [1, 2], then [1, 2, 4]); a line torn by a crash is dropped with a
  warning instead of failing the resume.

Run: python -m pytest tests/search_rl/trainer/test_trainer_faults.py -q   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from retriever_server.launcher import RetrieverProcess, bm25_env, free_port
from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.trainer.collect import RetrieverOutage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
QUERY = "<search> Deadpool 2 </search>"

BASE = [
    "model=tiny",
    "algorithm=grpo",
    "actor_rollout_ref.rollout.n=2",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "trainer.torch_threads_per_worker=1",
    "trainer.logger=[jsonl]",
    "trainer.test_freq=0",
    "actor_rollout_ref.rollout.max_turn_tokens=16",
    "actor_rollout_ref.rollout.max_obs_tokens=64",
    "actor_rollout_ref.rollout.max_response_tokens=160",
    # identical forced samples get equal rewards (zero advantages): the entropy term is what moves the weights
    "algorithm.entropy_coeff=0.01",
]


class AlwaysSearch:
    """Logits processor: every turn of every sample writes ``QUERY`` (then EOS), whatever the prompt."""

    BIAS = 100.0

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer.encode(QUERY, add_special_tokens=False)
        self.eos = tokenizer.eos_token_id

    def __call__(self, prompts, generated, logits):
        logits = logits.clone()
        for row, gen in enumerate(generated):
            logits[row, self.ids[len(gen)] if len(gen) < len(self.ids) else self.eos] += self.BIAS
        return logits


@pytest.fixture(scope="module")
def server_env(tmp_path_factory) -> dict[str, str]:
    return bm25_env(tmp_path_factory.mktemp("bm25-trainer-faults"))


@pytest.fixture
def server(server_env, tmp_path):
    proc = RetrieverProcess(env=server_env, port=free_port(), ready_timeout_s=180, log_path=tmp_path / "server.log")
    proc.start()
    yield proc
    proc.stop()


def _searching_trainer(run_dir: Path, url: str, tokenizer, *extra: str):
    """Trainer with local workers whose engine always searches (observe mode, a 1 s retry window)."""
    cfg = load_config(
        [
            *BASE,
            f"retriever.url={url}",
            f"trainer.default_local_dir={run_dir}",
            "max_turns=2",
            "retriever.retry_window_s=1",
            "actor_rollout_ref.rollout.on_retriever_error=observe",
            *extra,
        ]
    )
    prepared = prepare(cfg)  # the start-up check: the server is up
    actor, critic = build_workers(cfg, "cpu", local=True)
    actor.worker.engine.logits_processor = AlwaysSearch(tokenizer)
    return build_trainer(cfg, prepared, actor, critic), actor.worker.engine


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_observe_mode_stops_when_most_searches_fail(server, tokenizer, tmp_path):
    trainer, _ = _searching_trainer(tmp_path, server.url, tokenizer, "trainer.total_training_steps=2")
    server.stop()  # down for good, after the start-up check
    with pytest.raises(RetrieverOutage, match=r"step 1: 8 of 8 searches failed .*max_retriever_error_rate=0\.5"):
        trainer.fit()
    assert _steps(tmp_path) == [] and not list(tmp_path.glob("global_step_*"))


@pytest.mark.parametrize("train_on_errors", [False, True])
def test_trajectories_with_a_failed_search_are_left_out_of_the_loss(server, tokenizer, tmp_path, train_on_errors):
    trainer, engine = _searching_trainer(
        tmp_path,
        server.url,
        tokenizer,
        "trainer.total_training_steps=1",
        "trainer.save_freq=0",
        "actor_rollout_ref.rollout.max_retriever_error_rate=0.75",
        f"actor_rollout_ref.rollout.train_on_retriever_errors={str(train_on_errors).lower()}",
    )
    generate, calls = engine.generate, []

    def stop_before_second_turn(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first search turn was answered; the second one fails
            server.stop()
        return generate(*args, **kwargs)

    engine.generate = stop_before_second_turn
    m = dict(trainer.fit())[1]
    assert m["rollout/retriever_errors"] == 4 and m["rollout/retriever_error_rate"] == 0.5  # 4 of 8 searches
    assert math.isfinite(m["actor/loss"])
    if train_on_errors:
        assert "rollout/left_out_retriever_errors" not in m and m["actor/grad_norm"] > 0
    else:
        assert m["rollout/left_out_retriever_errors"] == 4 and m["actor/grad_norm"] == 0


KILLED_AFTER_COMMIT = textwrap.dedent(
    """
    import os, signal, sys
    from search_rl.trainer.checkpoint import CheckpointManager
    from search_rl.main_ppo import build_trainer, build_workers, prepare
    from search_rl.configure import load_config

    commit = CheckpointManager._commit

    def commit_then_die(self, tmp, step):
        commit(self, tmp, step)
        if step == 3:  # global_step_3 is renamed into place: die before anything else runs
            os.kill(os.getpid(), signal.SIGKILL)

    CheckpointManager._commit = commit_then_die
    cfg = load_config(sys.argv[1:])
    prepared = prepare(cfg)
    actor, critic = build_workers(cfg, "cpu", local=True)
    build_trainer(cfg, prepared, actor, critic).fit()
    """
)


def test_metrics_of_a_committed_checkpoint_survive_a_kill(tmp_path, caplog):
    overrides = [
        *BASE,
        "do_search=false",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.total_training_steps=4",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=0",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_COMMIT, *overrides], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (tmp_path / "global_step_3").is_dir() and _steps(tmp_path) == [1, 2, 3]
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "actor/lo')  # a later crash cut a line mid-write

    cfg = load_config(overrides)
    actor, critic = build_workers(cfg, "cpu", local=True)
    with caplog.at_level("WARNING"):
        history = build_trainer(cfg, prepare(cfg), actor, critic).fit()
    assert [s for s, _ in history] == [4] and "line 4 is not a metrics record" in caplog.text
    assert _steps(tmp_path) == [1, 2, 3, 4]
