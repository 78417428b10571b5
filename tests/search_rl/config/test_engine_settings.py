"""Nothing substituted silently: once ``configure.resolve`` knows the engine and its device, a rollout setting that
cannot apply there is refused (the user named both it and the engine) or warned about once (``engine=auto`` chose the
engine, or the setting only partly applies).

Run: python -m pytest tests/search_rl/config/test_engine_settings.py -q
"""

from __future__ import annotations

import logging

import pytest

from search_rl import configure
from search_rl.config import ConfigError
from search_rl.configure import load_config
from search_rl.rollout.engines import choice

ROLLOUT = "actor_rollout_ref.rollout"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees its warnings as the first of the process, on a machine without CUDA."""
    monkeypatch.setattr(choice, "_warned", set())
    monkeypatch.setattr(configure, "_cuda", lambda: False)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == choice.__name__]


@pytest.mark.parametrize("config_name", ["ppo_trainer", "eval"])
@pytest.mark.parametrize("engine", ["static", "vllm"])
def test_continuous_with_a_named_engine_without_sessions_is_refused(config_name, engine):
    with pytest.raises(
        ConfigError, match=rf"schedule=continuous with {ROLLOUT}\.engine={engine}: .*set {ROLLOUT}\.engine=hf"
    ):
        load_config([f"{ROLLOUT}.engine={engine}", f"{ROLLOUT}.schedule=continuous"], config_name=config_name)


def test_continuous_runs_on_the_hf_engine_without_a_word(caplog):
    cfg = load_config([f"{ROLLOUT}.engine=hf", f"{ROLLOUT}.schedule=continuous"], config_name="eval")
    assert cfg.rollout.schedule == "continuous" and not _warnings(caplog)


def test_continuous_where_auto_chose_another_engine_is_warned_once(monkeypatch, caplog):
    monkeypatch.setattr(choice, "choose_engine", lambda path, gpu: ("vllm", "vLLM is installed"))
    for _ in range(2):
        cfg = load_config([f"{ROLLOUT}.schedule=continuous"], config_name="eval")
    assert cfg.rollout.engine == "vllm"
    [warning] = _warnings(caplog)
    assert "schedule=continuous: rollouts run in turns" in warning and "engine=auto chose vllm" in warning


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "vllm.sleep_level=1",
            r"vllm\.sleep_level=1 needs a GPU .* set actor_rollout_ref\.rollout\.vllm\.sleep_level=0",
        ),
        ("vllm.weight_sync=ipc", r"vllm\.weight_sync=ipc sends CUDA IPC handles, .* on CPU; set .*weight_sync=disk"),
    ],
)
@pytest.mark.parametrize("config_name", ["ppo_trainer", "eval"])
def test_gpu_only_vllm_settings_are_refused_on_cpu_at_config_time(config_name, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config([f"{ROLLOUT}.engine=vllm", f"{ROLLOUT}.{override}"], config_name=config_name)


@pytest.mark.parametrize(("name", "why"), [("cuda_graphs", "CUDA graphs need a GPU"), ("compile", "no faster")])
def test_gpu_only_static_settings_are_refused_on_cpu_at_config_time(name, why):
    match = rf"static\.{name}=true, .*on CPU \(.*{why}.*set {ROLLOUT}\.static\.{name}=false \(or null"
    with pytest.raises(ConfigError, match=match):
        load_config([f"{ROLLOUT}.engine=static", f"{ROLLOUT}.static.{name}=true"], config_name="eval")


def test_where_the_cluster_decides_the_device_gpu_settings_pass(caplog):
    # trainer.device=auto on a remote Ray cluster: its GPUs are not visible from here, the engine checks them
    cfg = load_config(
        [f"{ROLLOUT}.engine=vllm", f"{ROLLOUT}.vllm.sleep_level=1", "trainer.ray_address=ray://head:10001"]
    )
    assert cfg.actor_rollout_ref.rollout.vllm.sleep_level == 1
    with pytest.raises(ConfigError, match="sleep_level=1 needs a GPU"):
        load_config([f"{ROLLOUT}.engine=vllm", f"{ROLLOUT}.vllm.sleep_level=1", "trainer.device=cpu"])


def test_settings_that_only_partly_apply_on_cpu_are_warned_once(caplog):
    for _ in range(2):
        load_config([f"{ROLLOUT}.engine=vllm", f"{ROLLOUT}.vllm.enforce_eager=false"], config_name="eval")
    [warning] = _warnings(caplog)
    assert "vllm.enforce_eager=false on CPU: there are no CUDA graphs" in warning


def test_settings_of_an_engine_that_does_not_run_are_named(caplog):
    load_config([f"{ROLLOUT}.engine=hf", f"{ROLLOUT}.vllm.kv_cache_gib=4"], config_name="eval")
    load_config([f"{ROLLOUT}.engine=vllm", f"{ROLLOUT}.hf.prefix_cache=false", f"{ROLLOUT}.hf.max_model_len=512"])
    assert _warnings(caplog) == [
        f"{ROLLOUT}.vllm.kv_cache_gib=4.0 do not apply: the rollout runs the hf engine",
        f"{ROLLOUT}.hf.prefix_cache=False do not apply: the rollout runs the vllm engine",
    ]
