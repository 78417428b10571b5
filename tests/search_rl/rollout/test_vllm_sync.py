"""The plumbing of vLLM weight sync that needs no engine: the supported vLLM range, the weight-sync choice per
machine (``auto`` is ``disk`` everywhere), the layouts the config refuses, the opt-in to pickled messages that
``ipc`` needs, and the offline client that makes an in-process ``vllm.LLM`` speak vLLM's trainer-side protocol. The
weight source itself is tested against each supported release in test_vllm_weight_source.py.

Run: python -m pytest tests/search_rl/rollout/test_vllm_sync.py -q   (the vllm case needs vLLM: make install-vllm)
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet

from search_rl.config import ConfigError, VLLMEngineConfig
from search_rl.configure import load_config
from search_rl.rollout.engines.vllm import weight_sync
from search_rl.rollout.engines.vllm.weight_sync import (
    INSECURE_SERIALIZATION,
    SUPPORTED_VLLM,
    OfflineClient,
    allow_pickled_messages,
    check_vllm_version,
    resolve_weight_sync,
)

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


def test_the_offline_client_wraps_the_payloads_the_way_llm_takes_them():
    llm = RecordingLLM()
    client = OfflineClient(llm)
    client.init_weight_transfer_engine({"packed": False})
    client.start_weight_update()
    client.update_weights({"names": ["w"]})
    client.finish_weight_update("7")
    assert llm.calls == [
        ("init_weight_transfer_engine", ({"init_info": {"packed": False}},)),
        ("start_weight_update", ()),
        ("update_weights", ({"update_info": {"names": ["w"]}},)),
        ("finish_weight_update", ("7",)),
    ]


def test_the_vllm_extra_admits_exactly_the_supported_releases():
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["vllm"]
    assert extra == [f"vllm{SUPPORTED_VLLM}"], "pyproject.toml's vllm extra and weight_sync.SUPPORTED_VLLM must agree"
    releases = ("0.31.9", "0.32.0", "0.32.4", "0.33.0", "0.33.2", "0.34.0")
    admitted = [v for v in releases if v in SpecifierSet(SUPPORTED_VLLM)]
    assert admitted == ["0.32.0", "0.32.4", "0.33.0", "0.33.2"], "test_vllm_weight_source.py covers 0.32 and 0.33"


def test_a_vllm_outside_the_supported_range_is_refused_by_name():
    for version in ("0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1.dev7+gabcdef"):
        check_vllm_version(version)
    for version in ("0.31.2", "0.34.0", "1.0.0"):
        with pytest.raises(ImportError, match=rf"supports vllm>=0.32,<0.34; this environment has vllm {version}"):
            check_vllm_version(version)


def test_weight_sync_choice_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_weight_sync("auto") == "disk"
    assert resolve_weight_sync("disk") == "disk"
    with pytest.raises(ValueError, match="weight_sync=ipc needs CUDA"):
        resolve_weight_sync("ipc")


def test_auto_is_disk_on_a_gpu_too_and_ipc_runs_only_when_named(monkeypatch):
    # ipc has never run on a GPU here and turns on vLLM's pickled messages: auto must not pick it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_weight_sync("auto") == "disk"
    assert resolve_weight_sync("ipc") == "ipc"


def test_nccl_weight_sync_is_refused_with_what_to_use_instead():
    with pytest.raises(ConfigError, match=r"weight_sync=nccl has no working layout.*use ipc \(GPU\) or disk"):
        VLLMEngineConfig(weight_sync="nccl")
    with pytest.raises(ConfigError, match="weight_sync=nccl"):
        load_config(["rollout=vllm", "actor_rollout_ref.rollout.vllm.weight_sync=nccl"])


def test_training_refuses_tensor_parallelism_its_one_gpu_workers_cannot_hold():
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2: in training each vLLM engine .* exactly one GPU"):
        load_config(["rollout=vllm", "actor_rollout_ref.rollout.vllm.tensor_parallel_size=2"])
    evaluation = load_config(["actor_rollout_ref.rollout.vllm.tensor_parallel_size=2"], config_name="eval")
    assert evaluation.actor_rollout_ref.rollout.vllm.tensor_parallel_size == 2, "evaluation's engine is in-process"


def test_ipc_will_not_override_pickled_messages_turned_off(monkeypatch):
    monkeypatch.setenv(INSECURE_SERIALIZATION, "0")
    with pytest.raises(ValueError, match=rf"{INSECURE_SERIALIZATION}='0'; unset it, or use .*weight_sync=disk"):
        allow_pickled_messages()


@pytest.mark.vllm
def test_ipc_turns_on_pickled_messages_for_vllm_and_says_so(monkeypatch, caplog):
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import vllm.envs

    monkeypatch.delenv(INSECURE_SERIALIZATION, raising=False)
    assert not vllm.envs.VLLM_ALLOW_INSECURE_SERIALIZATION
    with caplog.at_level("WARNING", logger=weight_sync.__name__):
        allow_pickled_messages()
    assert vllm.envs.VLLM_ALLOW_INSECURE_SERIALIZATION, "the engine core started next inherits it"
    assert "anyone who can write to them can run code" in caplog.text
