"""``rollout.engine=auto``: vLLM where installed and able to run the model (head_dim >= 32 on CPU), else HF, on a GPU
too until the static engine passes bench/gpu_round.py (then: static there for the models it models); the static
engine's graphs and compile off unless asked for until then.

Run: python -m pytest tests/search_rl/rollout/test_engine_choice.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig

import search_rl.configure as configure
from search_rl.config import HFEngineConfig, StaticEngineConfig
from search_rl.config.ppo import DEFAULT_TIS_CAP
from search_rl.configure import load_config
from search_rl.rollout.engines import choice
from search_rl.rollout.engines.choice import choose_engine, head_dim, vllm_installed


def _model_dir(tmp_path: Path, hidden: int, heads: int) -> str:
    LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads).save_pretrained(tmp_path)
    return str(tmp_path)


def test_without_vllm_gpu_and_cpu_get_the_hf_engine_until_the_static_engine_passes_the_gpu_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(choice, "vllm_installed", lambda: False)
    assert not choice.STATIC_PASSED_GPU_ROUND  # the current static engine has not run on a GPU
    engine, why = choose_engine("tiny", gpu=True)
    assert engine == "hf" and "has not passed bench/gpu_round.py" in why and "rollout=static" in why
    assert choose_engine("tiny", gpu=False) == ("hf", "vLLM is not installed")
    monkeypatch.setattr(choice, "STATIC_PASSED_GPU_ROUND", True)
    assert choose_engine("tiny", gpu=True)[0] == "static"
    assert choose_engine("tiny", gpu=False)[0] == "hf"


def test_graphs_and_compile_are_opt_in_until_the_static_engine_passes_the_gpu_round(monkeypatch, tiny_model, tokenizer):
    from search_rl.rollout.engines import factory

    default, asked = StaticEngineConfig(), StaticEngineConfig(cuda_graphs=True, compile=True)
    assert choice.static_features(default, gpu=True) == choice.static_features(default, gpu=False) == (False, False)
    assert choice.static_features(asked, gpu=True) == (True, True)
    assert choice.static_features(StaticEngineConfig(compile=True), gpu=True) == (False, True)
    engine = factory.build_static_engine(HFEngineConfig(), default, tiny_model, tokenizer)
    assert (engine.cuda_graphs, engine.compiled, engine.decoder.compiled) == (False, False, False)
    monkeypatch.setattr(choice, "STATIC_PASSED_GPU_ROUND", True)
    assert choice.static_features(default, gpu=True) == (True, True)  # then null means on a GPU
    assert choice.static_features(default, gpu=False) == (False, False)
    assert choice.static_features(StaticEngineConfig(cuda_graphs=False), gpu=True) == (False, True)


def test_with_vllm_the_cpu_choice_follows_the_head_dimension(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(choice, "vllm_installed", lambda: True)
    engine, why = choose_engine("tiny", gpu=False)
    assert engine == "hf" and "head_dim >= 32; tiny has 16" in why
    assert head_dim(_model_dir(tmp_path / "wide", hidden=128, heads=2)) == 64
    assert choose_engine(str(tmp_path / "wide"), gpu=False)[0] == "vllm"
    assert choose_engine(_model_dir(tmp_path / "narrow", hidden=96, heads=6), gpu=False)[0] == "hf"
    assert choose_engine("tiny", gpu=True)[0] == "vllm"  # the head-width limit is vLLM-CPU's only


def test_the_default_config_resolves_auto_and_turns_tis_on_for_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(["model=tiny", "trainer.device=cpu"])
    assert cfg.actor_rollout_ref.rollout.engine == "hf"  # tiny: vLLM-CPU cannot run it, installed or not
    assert cfg.algorithm.tis_cap == 0.0  # the HF engine in float32 samples as the trainer computes
    monkeypatch.setattr(choice, "choose_engine", lambda path, gpu: ("vllm", "test"))
    cfg = load_config(["model=tiny", "trainer.device=cpu"])
    assert cfg.actor_rollout_ref.rollout.engine == "vllm"
    assert cfg.algorithm.tis_cap == DEFAULT_TIS_CAP  # another sampler: its mismatch is corrected
    assert load_config(["model=tiny", "rollout=hf"]).actor_rollout_ref.rollout.engine == "hf"  # named: kept


def test_main_eval_resolves_auto_too() -> None:
    cfg = load_config(["model=tiny"], config_name="eval")
    assert cfg.actor_rollout_ref.rollout.engine == "hf"


def test_vllm_installed_matches_the_environment() -> None:
    try:
        import vllm  # noqa: F401

        present = True
    except ImportError:
        present = False
    assert vllm_installed() is present


@pytest.mark.vllm
def test_where_vllm_is_installed_the_default_rolls_out_smollm2_with_it() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    cfg = load_config(["trainer.device=cpu"])  # the default model, SmolLM2-135M: head_dim 64
    assert cfg.actor_rollout_ref.rollout.engine == "vllm"
    assert cfg.algorithm.tis_cap == DEFAULT_TIS_CAP
    assert load_config([], config_name="eval").actor_rollout_ref.rollout.engine == "vllm"


def test_the_evaluation_engine_runs_on_the_device_its_choice_was_made_for(monkeypatch, caplog) -> None:
    """On a GPU machine ``main_eval`` resolves ``auto`` for a GPU, so its engine must be built there (it was built on
    the CPU), and the log says where it runs."""
    import torch

    from search_rl.rollout import assembly

    monkeypatch.setattr(configure, "_cuda", lambda: True)
    monkeypatch.setattr(choice, "vllm_installed", lambda: False)
    assert load_config(["model=tiny"], config_name="eval").rollout.engine == "hf"  # what has run on a GPU
    monkeypatch.setattr(choice, "STATIC_PASSED_GPU_ROUND", True)  # as once it has: auto then chooses for a GPU
    cfg = load_config(["model=tiny"], config_name="eval")
    assert cfg.rollout.engine == "static"
    built = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(assembly, "build_rollout", lambda *a, device, **k: built.setdefault("device", device))
    with caplog.at_level("INFO", logger=assembly.__name__):
        assembly.build_standalone_rollout(
            cfg.rollout, cfg.rollout, None, cfg.model, policy=object(), dtype=torch.float32, retriever=None
        )
    assert built["device"].type == "cuda"
    assert "evaluation engine: static on cuda" in caplog.text


def test_a_gpu_without_vllm_gets_the_hf_engine_for_a_model_the_static_engine_does_not_model(monkeypatch, tmp_path):
    from transformers import Qwen2Config

    monkeypatch.setattr(choice, "vllm_installed", lambda: False)
    monkeypatch.setattr(choice, "STATIC_PASSED_GPU_ROUND", True)  # once it has passed, it still refuses these models
    sliding = tmp_path / "sliding"
    Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0).save_pretrained(sliding)
    engine, why = choose_engine(str(sliding), gpu=True)
    assert engine == "hf" and "sliding-window attention" in why
    plain = tmp_path / "plain"
    Qwen2Config().save_pretrained(plain)
    assert choose_engine(str(plain), gpu=True)[0] == "static"
