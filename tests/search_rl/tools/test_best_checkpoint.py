"""best_checkpoint: the validated, saved step with the best validation score, read from a real run's files.

Run: python -m pytest tests/search_rl/tools/test_best_checkpoint.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from search_rl.configure import load_config
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.tools.best_checkpoint import choose_step, main, saved_steps, validation_scores

pytestmark = pytest.mark.slow  # trains a real run first


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, float]]]:
    """Three GRPO steps of the tiny model (in-process workers, search off), validated before training and after
    every step, saved every second step (and at the end): the files a user's run leaves."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(
        [
            "model=tiny",
            "algorithm=grpo",
            "do_search=false",
            "trainer.logger=[jsonl]",
            "trainer.torch_threads_per_worker=1",
            "trainer.total_training_steps=3",
            "trainer.test_freq=1",
            "trainer.val_before_train=true",
            "trainer.save_freq=2",
            "trainer.max_ckpt_to_keep=0",
            "data.train_batch_size=2",
            "data.val_max_samples=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.max_turn_tokens=12",
            "actor_rollout_ref.rollout.max_response_tokens=32",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    actor, critic = build_workers(cfg, "cpu", local=True)
    history = build_trainer(cfg, prepare(cfg), actor, critic).fit()
    return run_dir, {step: m for step, m in history}


def test_scores_and_checkpoints_of_a_real_run(validated_run: tuple[Path, dict[int, dict[str, float]]]) -> None:
    run_dir, history = validated_run
    scores = validation_scores(run_dir)
    assert sorted(scores) == [0, 1, 2, 3]  # before training, then after every step
    assert scores == {step: m["val/all/em"] for step, m in history.items() if "val/all/em" in m}
    assert saved_steps(run_dir) == {2, 3}  # save_freq=2, and the last step
    # The tiny random model scores 0 everywhere: a tie, which goes to the earlier checkpoint.
    assert set(scores.values()) == {0.0} and choose_step(scores, saved_steps(run_dir)) == 2
    assert validation_scores(run_dir, "val/all/f1").keys() == scores.keys()


def test_cli_prints_the_curve_and_ends_with_the_chosen_folder(
    validated_run: tuple[Path, dict[int, dict[str, float]]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = validated_run
    assert main([str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == str(run_dir / "global_step_2")
    assert [line.split()[1] for line in lines[:-1]] == ["0", "1", "2", "3"]
    assert "<- best" in lines[2] and "(no checkpoint)" in lines[1] and lines[3].endswith("val/all/em 0.0000")


def test_best_score_wins_ties_go_to_the_earlier_step_and_step_0_is_never_chosen() -> None:
    scores = {0: 0.9, 5: 0.20, 10: 0.25, 15: 0.25, 20: 0.10}
    assert choose_step(scores, {5, 10, 15, 20}) == 10
    assert choose_step(scores, {5, 15, 20}) == 15  # step 10's checkpoint is gone
    assert choose_step(scores, {0, 5}) == 5
    with pytest.raises(
        ValueError, match=r"no checkpoint of a validated step: validated \[0, 5, 10, 15, 20\], saved \[7\]"
    ):
        choose_step(scores, {7})


def test_bad_metrics_files_are_named_with_their_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 1
    assert "metrics.jsonl not found" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/all/em": 0.5}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        validation_scores(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": "1", "val/all/em": 0.5}) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: expected an object with an integer 'step'"):
        validation_scores(tmp_path)
