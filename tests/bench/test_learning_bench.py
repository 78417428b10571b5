"""bench/learning_bench.py builds command lines the trainers accept, with the profile's settings in force."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from search_rl.configure import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("learning_bench")


def test_merge_overrides_keeps_the_last_value_of_a_key_in_its_first_place(bench: ModuleType) -> None:
    merged = bench.merge_overrides(["a=1", "b=2"], ("a=3", "c=4"), ["b=5"])
    assert merged == ["a=3", "b=5", "c=4"]


@pytest.mark.parametrize("profile", ["full", "quick", "long", "recipe"])
def test_every_profile_composes_under_the_real_configs(bench: ModuleType, profile: str, tmp_path: Path) -> None:
    """The commands name each key once and the composed configs carry the profile's budgets."""
    budget = bench.PROFILES[profile]
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", budget)
    sft_command = b.sft_command(tmp_path / "sft")
    sft = load_config(sft_command, config_name="sft_trainer")
    assert sft.trainer.total_training_steps == budget.sft_steps
    assert sft.actor_rollout_ref.rollout.max_obs_tokens == budget.max_obs_tokens
    for algorithm in ("grpo", "ppo"):
        rl_command = b.rl_command(algorithm, tmp_path / "sft" / "global_step_1", tmp_path / algorithm)
        for command in (sft_command, rl_command):
            keys = [o.partition("=")[0] for o in command]
            assert len(keys) == len(set(keys)), keys
        ppo = load_config(rl_command)
        assert ppo.trainer.total_training_steps == budget.rl_steps
        assert ppo.actor_rollout_ref.rollout.max_turn_tokens == budget.max_turn_tokens
        assert ppo.actor_rollout_ref.rollout.max_obs_tokens == budget.max_obs_tokens
        assert ppo.trainer.test_freq == budget.val_every


def test_the_recipe_profile_trains_lora_at_its_own_learning_rates(bench: ModuleType, tmp_path: Path) -> None:
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE)
    sft = load_config(b.sft_command(tmp_path / "sft"), config_name="sft_trainer")
    assert sft.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-4)
    assert sft.actor_rollout_ref.actor.optim.lr_warmup_steps == 2
    grpo = load_config(b.rl_command("grpo", tmp_path / "sft" / "global_step_12", tmp_path / "grpo"))
    assert grpo.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-4)  # RL_DEFAULTS' 1e-5 replaced, not repeated
    assert (grpo.model.lora_rank, grpo.model.lora_alpha) == (16, 32)
    assert grpo.trainer.val_before_train is True


def test_a_command_line_override_wins_over_the_profile(bench: ModuleType, tmp_path: Path) -> None:
    b = bench.Bench(
        tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE, rl_overrides=["actor_rollout_ref.actor.optim.lr=3e-5"]
    )
    grpo = load_config(b.rl_command("grpo", tmp_path / "start", tmp_path / "grpo"))
    assert grpo.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-5)


@pytest.mark.parametrize("profile", ["quick", "recipe"])
def test_the_rft_row_samples_train_and_fine_tunes_the_warm_start_at_its_own_rate(
    bench: ModuleType, profile: str, tmp_path: Path
) -> None:
    """Sampling reads training questions (never test) from the warm start; the fine-tune starts from it at RFT's
    learning rate, validating and keeping a checkpoint at the same steps so one can be chosen."""
    budget = bench.PROFILES[profile]
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", budget)
    start = tmp_path / "sft" / "global_step_12"
    sample = load_config(b.rft_sample_command(start, tmp_path / "rft_data" / "samples"), config_name="eval")
    assert sample.data.files == [bench.TRAIN_FILE]
    assert (sample.n_samples, sample.data.max_samples) == (budget.rft_samples, budget.rft_questions)
    assert sample.model.path == str(start)
    assert sample.actor_rollout_ref.rollout.max_obs_tokens == budget.max_obs_tokens
    command = b.rft_sft_command(start, tmp_path / "rft_data" / "rows.parquet", tmp_path / "rft")
    keys = [o.partition("=")[0] for o in command]
    assert len(keys) == len(set(keys)), keys
    sft = load_config(command, config_name="sft_trainer")
    assert sft.model.path == str(start)
    assert sft.data.train_files == [str(tmp_path / "rft_data" / "rows.parquet")]
    assert sft.actor_rollout_ref.actor.optim.lr == pytest.approx(2e-5)  # not the warm start's 1e-4 (recipe)
    assert sft.trainer.total_training_steps == budget.rft_steps
    assert sft.trainer.save_freq == sft.trainer.test_freq == budget.rft_val_every
    assert sft.trainer.val_before_train is True
    assert sft.trainer.max_ckpt_to_keep >= budget.rft_steps // budget.rft_val_every


def test_the_rft_rows_arguments_parse_under_the_tool_and_name_real_files(bench: ModuleType, tmp_path: Path) -> None:
    from search_rl.tools import rft_rows

    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE)
    args = rft_rows.build_parser().parse_args(b.rft_rows_command(tmp_path / "rft_data"))
    assert args.records == [tmp_path / "rft_data" / "samples"]
    assert args.output == tmp_path / "rft_data" / "rows.parquet"
    assert (args.max_per_question, args.without_think, args.min_rows) == (2, True, bench.RECIPE.sft_batch)
    for shipped in (args.questions, args.mix, args.corpus):  # relative to the repository, where the bench runs them
        assert (REPO / shipped).is_file(), shipped


def test_other_warm_start_rows_train_the_warm_start_and_are_mixed_into_rft(bench: ModuleType, tmp_path: Path) -> None:
    rows = tmp_path / "bare" / "sft_train.parquet"
    b = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE, warm_start_rows=str(rows))
    sft = load_config(b.sft_command(tmp_path / "sft"), config_name="sft_trainer")
    assert sft.data.train_files == [str(rows)]
    from search_rl.tools import rft_rows

    assert rft_rows.build_parser().parse_args(b.rft_rows_command(tmp_path / "rft_data")).mix == rows
    default = bench.Bench(tmp_path, "http://127.0.0.1:8000/retrieve", bench.RECIPE)
    assert load_config(default.sft_command(tmp_path / "sft"), config_name="sft_trainer").data.train_files == [
        bench.WARM_START_FILE
    ]


def test_missing_warm_start_rows_are_refused_by_name(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = sys.argv
    missing = tmp_path / "nope.parquet"
    sys.argv = ["learning_bench.py", "--rows", "sft", "--warm-start-rows", str(missing), "--out", str(tmp_path)]
    try:
        with pytest.raises(SystemExit):
            bench.main()
    finally:
        sys.argv = argv
    assert f"--warm-start-rows: no file {missing}" in capsys.readouterr().err


def test_report_only_keeps_the_chosen_steps_and_warm_start_rows(bench: ModuleType, tmp_path: Path) -> None:
    """Rewriting a finished run's report keeps what validation chose (steps in numeric order) and its rows file."""
    previous = {
        "retriever": "http://127.0.0.1:8000/retrieve",
        "warm_start_rows": "runs/bare/sft_train.parquet",
        "results": {},
        "wall_seconds": {"sft": 1.0, "total": 2.0},
        "commands": ["python -m search_rl.main_sft"],
        "chosen_on_validation": {"rft": {"step": 8, "val_em": {"0": 0.27, "16": 0.28, "4": 0.26, "8": 0.29}}},
    }
    (tmp_path / "results.json").write_text(json.dumps(previous))
    argv = sys.argv
    sys.argv = ["learning_bench.py", "--report-only", "--out", str(tmp_path)]
    try:
        bench.main()
    finally:
        sys.argv = argv
    rewritten = json.loads((tmp_path / "results.json").read_text())
    assert rewritten["warm_start_rows"] == "runs/bare/sft_train.parquet"
    assert rewritten["chosen_on_validation"]["rft"]["step"] == 8
    report = (tmp_path / "results.md").read_text()
    assert "scored at step 8, chosen on validation EM by step (0: 0.270, 4: 0.260, 8: 0.290, 16: 0.280)" in report


def test_an_unknown_row_is_refused_by_name(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    argv = sys.argv
    sys.argv = ["learning_bench.py", "--rows", "sft,rtf", "--retriever-url", "http://127.0.0.1:9/retrieve"]
    try:
        with pytest.raises(SystemExit):
            bench.main()
    finally:
        sys.argv = argv
    assert "unknown row(s) rtf" in capsys.readouterr().err


def test_finished_samples_of_the_same_warm_start_are_reused_and_nothing_else(bench: ModuleType, tmp_path: Path) -> None:
    """A failure after sampling (e.g. in rft_rows) must not cost the ~30 min sampling again; a run cut off midway
    (no metrics.json, written last), another model or another sample count is not reused."""
    start = tmp_path / "warm" / "global_step_12"

    def sample_run(name: str, model: Path, n_samples: int, n: float, finished: bool = True) -> Path:
        folder = tmp_path / "samples" / name
        folder.mkdir(parents=True)
        (folder / "trajectories.jsonl").write_text("")
        if finished:
            metrics = {"model": str(model), "baseline": "search", "n_samples": n_samples, "eval/all/n": n}
            (folder / "metrics.json").write_text(json.dumps(metrics))
        return folder

    assert bench.finished_samples(tmp_path / "samples", start, 512, 4) is None
    sample_run("search-20261125-100000", start, 4, 2048.0)
    sample_run("search-20261125-110000", tmp_path / "other", 4, 2048.0)
    sample_run("search-20261125-120000", start, 8, 4096.0)
    sample_run("search-20261125-130000", start, 4, 2048.0, finished=False)
    assert bench.finished_samples(tmp_path / "samples", start, 512, 4).name == "search-20261125-100000"
    assert bench.finished_samples(tmp_path / "samples", start, 256, 4) is None  # fewer questions asked for
    newer = sample_run("search-20261125-140000", start, 4, 2048.0)
    assert bench.finished_samples(tmp_path / "samples", start, 512, 4) == newer
