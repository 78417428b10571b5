"""Trainer configuration: Hydra composition into typed dataclasses, and every error caught before Ray starts.

Unknown keys and wrong types fail at compose time; out-of-range fields in ``__post_init__``; cross-field problems
(length budgets against the model's context, batch sizes against workers, group estimators without groups) in
``PPOConfig.validate``, called by ``main_ppo.prepare``. The CLI tests check the same through
``python -m search_rl.main_ppo``: a clear message, a non-zero exit, and no Ray started.

Run: python -m pytest tests/search_rl/config/test_train_config.py -q
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from retriever_server.launcher import free_port
from search_rl.config import CONFIG_DIR, ConfigError, PPOConfig
from search_rl.config import algorithm as algorithm_config
from search_rl.config import eval as eval_config
from search_rl.config import model as model_config
from search_rl.config import ppo as ppo_config
from search_rl.config import roles as roles_config
from search_rl.config import rollout as rollout_config
from search_rl.config import run as run_config
from search_rl.config import sft as sft_config
from search_rl.configure import load_config
from search_rl.main_ppo import prepare

REPO = Path(__file__).resolve().parents[3]
MY_YAMLS = [
    "ppo_trainer.yaml",
    "eval.yaml",
    "sft_trainer.yaml",
    "model",
    "algorithm",
    "rollout",
    "data",
    "retriever",
    "trainer",
]


def test_defaults_are_ppo_with_critic_and_grpo_switches():
    cfg = load_config([])
    assert isinstance(cfg, PPOConfig)
    assert (cfg.algorithm.adv_estimator, cfg.use_critic, cfg.n_samples, cfg.use_reference) == ("gae", True, 1, True)
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.retriever.urls == ["http://127.0.0.1:8000"]
    assert cfg.actor_rollout_ref.rollout.search_turns == 4 and cfg.trainer.default_local_dir == "runs/default"
    grpo = load_config(["algorithm=grpo", "max_turns=2", "do_search=false"])
    assert (grpo.algorithm.adv_estimator, grpo.use_critic, grpo.n_samples) == ("grpo", False, 4)
    assert (grpo.max_turns, grpo.do_search, grpo.actor_rollout_ref.rollout.search_turns) == (2, False, 0)
    switched = load_config(["algorithm.adv_estimator=grpo"])  # the Search-R1 way of switching works too
    assert (switched.use_critic, switched.n_samples) == (False, 4)
    assert load_config(["trainer=gpu"]).trainer.device == "cuda"


def test_unknown_key_and_wrong_type_fail_at_compose():
    with pytest.raises(ConfigCompositionException, match="Could not override 'trainer.totl_training_steps'"):
        load_config(["trainer.totl_training_steps=3"])
    with pytest.raises(ConfigCompositionException) as info:
        load_config(["trainer.total_training_steps=three"])
    assert "could not be converted to Integer" in str(info.value.__cause__)
    with pytest.raises(ConfigCompositionException):
        load_config(["algorithm.mask_observations=maybe"])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["actor_rollout_ref.rollout.max_turn_tokens=2000"], "max_turn_tokens=2000 exceeds"),
        (["algorithm.adv_estimator=nope"], "adv_estimator='nope' is not usable"),
        (["trainer.n_workers=0"], "n_workers must be >= 1"),
        (["trainer.logger=[console,slack]"], "unknown sinks \\['slack'\\]"),
        (["trainer.resume=/no/such/checkpoint"], "neither 'auto', 'disable'"),
        (["model.dtype=float8"], "model.dtype must be one of"),
        (
            ["actor_rollout_ref.actor.old_logprobs=update", "actor_rollout_ref.actor.ppo_epochs=2"],
            "old_logprobs=update needs ppo_epochs=1",
        ),
    ],
)
def test_out_of_range_fields(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(overrides)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm=grpo", "actor_rollout_ref.rollout.n=1"], "set it to 2 or more"),
        (["data.train_batch_size=5"], "not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=2"),
        (["trainer.n_workers=3"], "cannot be split evenly over trainer.n_workers=3"),
        (["algorithm.adv_estimator=gae", "critic.enable=false"], "needs a critic"),
        (
            ["actor_rollout_ref.actor.old_logprobs=update", "algorithm.use_kl_in_reward=true"],
            "use_kl_in_reward needs them before it",
        ),
    ],
)
def test_cross_field_checks(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides).validate(max_model_len=8192)


def test_impossible_length_budget_is_caught_by_prepare_before_anything_starts():
    cfg = load_config(
        [
            "model=tiny",
            "actor_rollout_ref.rollout.max_prompt_tokens=3500",
            "actor_rollout_ref.rollout.max_response_tokens=1024",
            "retriever.url=http://127.0.0.1:9",
        ]
    )
    with pytest.raises(ConfigError, match="impossible length budget: .* = 4524 exceeds the model's context of 4096"):
        prepare(cfg)


def _yaml_files() -> list[Path]:
    out = []
    for name in MY_YAMLS:
        path = CONFIG_DIR / name
        out += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return out


def test_every_yaml_key_has_a_comment_above_and_no_inline_comment():
    key = re.compile(r"^\s*(- )?[A-Za-z_][\w./@-]*:")
    problems = []
    for path in _yaml_files():
        previous = ""
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            stripped = line.strip()
            if not stripped:
                continue
            if key.match(line) and not previous.startswith("#"):
                problems.append(f"{path.name}:{number} no comment above {stripped!r}")
            if not stripped.startswith("#") and re.search(r"\s#", line):
                problems.append(f"{path.name}:{number} inline comment")
            previous = stripped
    assert not problems, "\n".join(problems)


def test_every_field_has_an_attribute_docstring():
    checked = 0
    for module in (
        model_config,
        rollout_config,
        roles_config,
        algorithm_config,
        run_config,
        ppo_config,
        sft_config,
        eval_config,
    ):
        tree = ast.parse(inspect.getsource(module))
        for node in tree.body:
            cls = getattr(module, getattr(node, "name", ""), None)
            if not (isinstance(node, ast.ClassDef) and node.name.endswith("Config") and dataclasses.is_dataclass(cls)):
                continue
            documented = {
                a.target.id
                for a, nxt in zip(node.body, node.body[1:], strict=False)
                if isinstance(a, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
            }
            own = {f.name for f in dataclasses.fields(cls)} - {
                f.name for b in cls.__bases__ if dataclasses.is_dataclass(b) for f in dataclasses.fields(b)
            }
            assert own <= documented, f"{cls.__name__}: {sorted(own - documented)}"
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("eval", "rollout.max_turn_tokens=16", "actor_rollout_ref.rollout.max_turn_tokens"),
        ("eval", "engine.max_batch_size=8", "actor_rollout_ref.rollout.hf.max_batch_size"),
        ("sft_trainer", "optim.lr=1e-4", "actor_rollout_ref.actor.optim.lr"),
        ("sft_trainer", "micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        ("sft_trainer", "+grad_clip=0.5", "actor_rollout_ref.actor.grad_clip"),
    ],
)
def test_moved_keys_fail_naming_the_new_key(name, old, new):
    with pytest.raises(ConfigError, match=re.escape(f"is now {new}")):
        load_config([old], config_name=name)


def test_the_same_setting_has_the_same_path_in_every_entry_point():
    # the rollout budgets and the actor's optimizer are named alike by main_ppo, main_sft and main_eval
    key = "actor_rollout_ref.rollout.max_turn_tokens=17"
    for name in ("ppo_trainer", "sft_trainer", "eval"):
        assert load_config([key], config_name=name).actor_rollout_ref.rollout.max_turn_tokens == 17
    for name in ("ppo_trainer", "sft_trainer"):
        cfg = load_config(["actor_rollout_ref.actor.optim.lr=3e-4"], config_name=name)
        assert cfg.actor_rollout_ref.actor.optim.lr == 3e-4
    assert (
        load_config(["actor_rollout_ref.rollout.hf.max_batch_size=5"], config_name="eval").rollout.hf.max_batch_size
        == 5
    )


@pytest.mark.integration
def test_cli_names_the_new_key_of_a_moved_one():
    proc = subprocess.run(
        [sys.executable, "-m", "search_rl.main_eval", "rollout.max_turn_tokens=16"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "rollout.max_turn_tokens is now actor_rollout_ref.rollout.max_turn_tokens" in proc.stderr


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "search_rl.main_ppo", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.mark.integration
def test_cli_unknown_key_fails_before_ray():
    start = time.monotonic()
    proc = _run_cli("model=tiny", "trainer.totl_training_steps=1")
    assert proc.returncode != 0
    assert "Could not override 'trainer.totl_training_steps'" in proc.stderr + proc.stdout
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert time.monotonic() - start < 300  # Ray never started (above); a bound generous enough for a loaded machine


@pytest.mark.integration
def test_cli_unreachable_retriever_fails_fast_saying_how_to_start_it(tmp_path):
    port = free_port()
    proc = _run_cli(
        "model=tiny", f"retriever.url=http://127.0.0.1:{port}/retrieve", f"trainer.default_local_dir={tmp_path}"
    )
    out = proc.stderr + proc.stdout
    assert proc.returncode == 2, out
    assert f"retriever at http://127.0.0.1:{port} is not reachable" in out
    assert "uvicorn retriever_server.app:app" in out and "Started a local Ray instance" not in out


@pytest.mark.parametrize("override", ["+no_such_key=1", "+data.train_fils=[x.parquet]", "+trainer.steps=3"])
def test_keys_the_schema_lacks_are_errors_even_with_plus(override):
    with pytest.raises(ConfigError, match="unknown config keys"):
        load_config([override])


def test_new_dict_entries_are_still_allowed():
    assert load_config(["+reward.by_data_source.nq=qa_f1"]).reward.by_data_source == {"nq": "qa_f1"}


def _val_uids(*overrides: str) -> list[str]:
    cfg = load_config(["model=tiny", "do_search=false", "data.val_max_samples=20", "trainer.logger=[]", *overrides])
    prepared = prepare(cfg)
    assert prepared.val_batch is not None
    return list(prepared.val_batch.uids)


def test_the_validation_subset_does_not_move_with_the_training_seed():
    """Runs of different seeds are chosen between on validation, so they must see the same questions."""
    base = _val_uids()
    assert _val_uids("trainer.seed=1") == base and len(base) == 20
    assert _val_uids("data.val_seed=1") != base
