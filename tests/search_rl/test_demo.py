"""The demo's retriever lifecycle: it serves, and it stops the server it started when the run fails or on Ctrl-C.

The full journey (train, evaluate, plots, viewer command) runs in ``tests/test_readme.py`` (slow).

Run: python -m pytest tests/search_rl/test_demo.py -q
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

from retriever_server.launcher import free_port
from search_rl.configure import load_config
from search_rl.demo import cli
from search_rl.demo.budgets import BUDGETS_FILE, check_budgets
from search_rl.demo.cli import main
from search_rl.demo.overrides import eval_overrides, sft_overrides, train_overrides
from search_rl.demo.progress import ProgressSink
from search_rl.demo.settings import DATASET_DIR, RL_QUESTIONS, DemoSettings
from search_rl.demo.stages import evaluate, find_eval
from search_rl.main_eval import load_eval_config
from search_rl.main_sft import load_sft_config


@pytest.fixture
def bm25(monkeypatch):
    """The demo's child server uses BM25 (its index is built in seconds and cached)."""
    monkeypatch.setenv("RETRIEVER_METHOD", "bm25")
    monkeypatch.setenv("RETRIEVER_SHOW_PROGRESS", "false")


def test_stages_share_the_search_loop_and_budgets(tmp_path):
    """Every stage composes into a valid config; training and evaluation run the same search loop, RL starts from
    the warm start, and every stage is scored on the same questions (the paired comparison relies on it)."""
    s = DemoSettings(10, 8, 4, 4, 4, 50, tmp_path, "smollm2", 2, False)
    url = "http://127.0.0.1:1/retrieve"
    start = tmp_path / "sft" / "global_step_10"
    sft = load_sft_config(sft_overrides(s, url))
    rl = load_config(train_overrides(s, url, start))
    evals = [load_eval_config(eval_overrides(s, url, st, c)) for st, c in (("base", None), ("rl", start))]
    for cfg, rollout in ((sft, sft.rollout), (rl, rl.actor_rollout_ref.rollout), *((e, e.rollout) for e in evals)):
        assert (cfg.max_turns, rollout.max_turn_tokens, rollout.max_obs_tokens) == (2, 64, 384)
        assert rollout.max_response_tokens == 1024
    assert rl.model.path == str(start) and rl.algorithm.adv_estimator == "grpo"
    assert (rl.model.lora_rank, rl.actor_rollout_ref.actor.optim.lr) == (16, 1e-4) and sft.model.lora_rank == 0
    assert rl.actor_rollout_ref.rollout.n == 4 and rl.data.train_batch_size == 4
    assert rl.algorithm.filter_groups.enable and rl.algorithm.filter_groups.max_num_gen_batches == 2
    one_batch = load_config(train_overrides(dataclasses.replace(s, gen_batches=1), url, start))
    assert not one_batch.algorithm.filter_groups.enable
    assert rl.data.train_files == [str(RL_QUESTIONS)] and sft.data.train_files != rl.data.train_files
    assert sft.trainer.default_local_dir == str(tmp_path / "sft")
    assert rl.trainer.default_local_dir == str(tmp_path / "rl")
    assert evals[1].model.path == str(start / "actor") and evals[0].model.path == sft.model.path
    assert {e.data.max_samples for e in evals} == {50} and evals[0].output_dir == str(tmp_path / "eval" / "base")
    seeded = dataclasses.replace(s, seed=3)
    trained = (load_sft_config(sft_overrides(seeded, url)), load_config(train_overrides(seeded, url, start)))
    assert [c.trainer.seed for c in trained] == [3, 3] and sft.trainer.seed == rl.trainer.seed == 0
    assert load_eval_config(eval_overrides(seeded, url, "rl", start)).data.seed == evals[1].data.seed
    assert len({sft.model.dtype, rl.model.dtype, *(e.model.dtype for e in evals)}) == 1  # auto, resolved alike
    f32 = dataclasses.replace(s, dtype="float32")
    staged = (sft_overrides(f32, url), train_overrides(f32, url, start), eval_overrides(f32, url, "rl", start))
    loaders = (load_sft_config, load_config, load_eval_config)
    assert [load(o).model.dtype for load, o in zip(loaders, staged, strict=True)] == ["float32"] * 3


def test_rl_questions_are_training_questions_with_their_manifest():
    """The shipped RL list is a subset of the training split (never test or validation questions), in its schema,
    and its manifest counts every training question under one reason."""
    kept = pd.read_parquet(RL_QUESTIONS)
    train = pd.read_parquet(DATASET_DIR / "train.parquet")
    assert list(kept.columns) == list(train.columns) and 0 < len(kept) < len(train)

    def ids(frame: pd.DataFrame) -> set[str]:
        return {info["id"] for info in frame["extra_info"]}

    assert ids(kept) <= ids(train)
    for split in ("test", "val"):
        assert not ids(kept) & ids(pd.read_parquet(DATASET_DIR / f"{split}.parquet"))
    manifest = json.loads(RL_QUESTIONS.with_name("rl_kept.manifest.json").read_text())
    reasons = manifest["questions_by_reason"]
    assert reasons["kept"] == len(kept) and sum(reasons.values()) == len(train)


def test_rl_progress_prints_the_groups_with_signal(capsys):
    sink = ProgressSink(3, desc="rl", groups=4)
    sink.log({"reward/groups_all_equal": 0.25, "reward/score_mean": 0.5}, step=1)
    sink.log({"reward/groups_all_equal": 1.0}, step=2)
    sink.close()
    out = capsys.readouterr()
    text = out.out + out.err
    assert "step 1: 3 of 4 groups with signal" in text and "step 2: 0 of 4 groups with signal" in text


def test_rl_progress_with_dynamic_sampling_counts_the_groups_trained(capsys):
    """With dynamic sampling the line counts the groups the step trained on (all with signal), not the share of
    flat groups averaged over its generation batches."""
    sink = ProgressSink(3, desc="rl", groups=4)
    filtered = {"dynamic_sampling/trained_groups": 3.0, "dynamic_sampling/gen_batches": 2.0}
    sink.log({**filtered, "dynamic_sampling/dropped_groups": 5.0, "reward/groups_all_equal": 0.625}, step=1)
    sink.close()
    out = capsys.readouterr()
    text = out.out + out.err
    assert "step 1: 3 of 4 groups with signal trained" in text and "2 generation batches, 5 flat groups dropped" in text
    assert "1 of 4" not in text  # not the flat share of the generation batches


def test_a_run_folder_is_reused_only_with_its_own_budgets(tmp_path):
    """A rerun with the same settings may reuse the folder; other budgets (or a folder from before budgets were
    recorded) are refused with the difference named, and --fresh starts over and records the new ones."""
    run = tmp_path / "demo"
    s = DemoSettings(10, 8, 3, 4, 4, 50, run, "smollm2", 2, False)
    check_budgets(s)
    check_budgets(s)  # same settings: reusable
    assert json.loads((run / BUDGETS_FILE).read_text())["max_obs_tokens"] == 384
    narrow = dataclasses.replace(s, max_obs_tokens=160)
    with pytest.raises(ValueError, match=r"max_obs_tokens: 384 there, 160 now.*--fresh"):
        check_budgets(narrow)
    check_budgets(dataclasses.replace(narrow, fresh=True))
    assert json.loads((run / BUDGETS_FILE).read_text())["max_obs_tokens"] == 160
    # a folder recorded before the seed was: made with seed 0, so reusable at seed 0 only
    recorded = json.loads((run / BUDGETS_FILE).read_text())
    del recorded["seed"]
    (run / BUDGETS_FILE).write_text(json.dumps(recorded))
    check_budgets(narrow)
    with pytest.raises(ValueError, match=r"seed: 0 there, 1 now"):
        check_budgets(dataclasses.replace(narrow, seed=1))
    # ... and before dynamic sampling was: one generation batch per step
    del recorded["gen_batches"]
    (run / BUDGETS_FILE).write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match=r"gen_batches: 1 there, 2 now"):
        check_budgets(narrow)
    check_budgets(dataclasses.replace(narrow, gen_batches=1))
    old = tmp_path / "old"
    (old / "sft").mkdir(parents=True)
    with pytest.raises(ValueError, match="without budgets.json"):
        check_budgets(dataclasses.replace(s, run_dir=old))


@pytest.mark.parametrize("flag", ["--max-turns", "--max-obs-tokens", "--gen-batches"])
def test_budget_flags_must_be_positive(flag, capsys):
    """The response budget is computed from these: a non-positive value is refused before anything starts."""
    with pytest.raises(SystemExit) as exit_info:
        main([flag, "0"])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.integration
def test_evaluation_console_shows_progress_and_summary_not_every_metric(retriever_url, tmp_path, caplog):
    """A stage's evaluation prints its progress and one summary line; the per-metric dump (about 40 lines of
    ``eval/<source>/<metric> = value``) stays in its metrics.json."""
    s = DemoSettings(1, 2, 1, 2, 2, 2, tmp_path, "tiny", 1, False)
    caplog.set_level("INFO")
    out = evaluate(s, retriever_url, "base", None, reuse=False)
    metrics = json.loads((out / "metrics.json").read_text())
    assert len([k for k in metrics if k.startswith("eval/")]) > 10
    assert "rolled out 2/2" in caplog.text
    assert any(re.fullmatch(r"base: eval n=2 em=\S+ subem=\S+ f1=\S+", m) for m in caplog.messages), caplog.text
    dumped = [m for m in caplog.messages if re.match(r"eval/\S+ = ", m)]
    assert not dumped, f"per-metric lines on the console: {dumped[:3]}"
    dtype = metrics["fingerprint"]["engine"]["dtype"]
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    assert find_eval(s, "base", metrics["model"], dtype) == out  # reused in its own dtype only
    assert find_eval(s, "base", metrics["model"], other) is None


def _down(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.integration
def test_serve_only_exit(bm25, caplog):
    port = free_port()
    caplog.set_level("INFO", logger="search_rl.demo")
    assert main(["--serve-only", "--exit", "--port", str(port)]) == 0
    assert "Q: who got the first nobel prize in physics" in caplog.text
    assert _down(port)


@pytest.mark.integration
def test_failed_run_stops_the_retriever(bm25, tmp_path):
    port = free_port()
    with pytest.raises(ValueError, match="train_batch_size"):  # a real config error, raised after the server is up
        main(["--model", "tiny", "--sft-batch", "0", "--port", str(port), "--run-dir", str(tmp_path)])
    assert (tmp_path / "retriever.log").exists()
    assert _down(port)


def test_an_interrupt_a_library_rewrapped_still_exits_130(monkeypatch, tmp_path, caplog):
    """Ctrl-C that a library caught and turned into another error (OmegaConf does, while Hydra imports) still ends
    the demo as an interruption: exit code 130, not a traceback; the SIGINT handler is Python's again afterwards."""

    def run_demo(s, port):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs here
        except KeyboardInterrupt as e:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'") from e
        raise AssertionError("SIGINT did not interrupt")

    monkeypatch.setattr(cli, "run_demo", run_demo)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert cli.main(["--model", "tiny", "--port", "0", "--run-dir", str(tmp_path)]) == 130
    assert "interrupted" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def broken(s, port):
        raise AttributeError("a real bug")

    monkeypatch.setattr(cli, "run_demo", broken)
    with pytest.raises(AttributeError, match="a real bug"):  # without an interrupt an error stays an error
        cli.main(["--model", "tiny", "--port", "0", "--run-dir", str(tmp_path)])


@pytest.mark.integration
def test_ctrl_c_stops_the_retriever(tmp_path):
    """SIGINT while training starts: the demo ends with shell status 130, and the retriever it started is gone."""
    port = free_port()
    env = {**os.environ, "RETRIEVER_METHOD": "bm25", "RETRIEVER_SHOW_PROGRESS": "false"}
    argv = [sys.executable, "-m", "search_rl.demo", "--model", "tiny", "--port", str(port), "--run-dir", str(tmp_path)]
    log = open(tmp_path / "demo.log", "w")  # noqa: SIM115 (closed below); a pipe nobody reads could fill and block
    # A shell that runs a job in the background (as CI may) starts it with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored; give the demo the default disposition a terminal user has.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Wait for the demo's own retriever: its log names the URL (the demo moves off a port something else took
        # meanwhile, and a signal that arrives while Python is still importing is not the demo's to handle).
        deadline, found = time.monotonic() + 300, None
        started = re.compile(r"starting the retriever at http://127\.0\.0\.1:(\d+) ")
        while proc.poll() is None and time.monotonic() < deadline:
            found = started.search((tmp_path / "demo.log").read_text())
            if found and not _down(int(found[1])):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"demo exited early ({proc.returncode}) before the retriever was up"
        assert found, "the demo never logged the retriever's URL"
        port = int(found[1])
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        tail = "\n".join((tmp_path / "demo.log").read_text(errors="replace").splitlines()[-40:])
        # 130 from main(), or death by SIGINT after the clean-up ran (Python exits so when a KeyboardInterrupt
        # escapes): a shell reports both as status 130. The retriever being gone (below) is the clean-up's check.
        assert code in (130, -signal.SIGINT), f"exit code {code}; the end of the demo's log:\n{tail}"
    finally:
        proc.kill()
        log.close()
    assert _down(port)
