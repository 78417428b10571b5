"""``model.dtype=auto``: the compute dtype of each kind of machine (its CPU flags and GPU stubbed), resolved by the
config before anything reads it, left to the workers of a cluster, and shown by ``diagnose``.

Run: python -m pytest tests/search_rl/models/test_compute_dtype.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch

from search_rl import configure
from search_rl.configure import load_config
from search_rl.models import compute_dtype
from search_rl.models.compute_dtype import compute_dtype_on, cpu_flags, resolve_compute_dtype
from search_rl.tools import diagnose

AMX_CPU = "fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
"""The AMX flags of the machine the bf16 speed-ups were measured on (``amx_bf16 amx_tile amx_int8 avx512_bf16``)."""
AVX512_BF16_CPU = "fpu sse2 avx avx2 avx512f avx512_bf16"
AVX2_CPU = "fpu sse2 avx avx2 fma"
"""The reference machine's kind (AMD EPYC, AVX2 only)."""


@pytest.fixture
def machine(monkeypatch):
    """``machine(cpu_flags, cuda_bf16=False)``: what the resolution sees of this process's CPU and GPU; the config's
    own CUDA probe says no GPU, so ``trainer.device=auto`` means the CPU here on any test machine."""

    def stub(flags: str, cuda_bf16: bool = False) -> None:
        monkeypatch.setattr(compute_dtype, "cpu_flags", lambda: frozenset(flags.split()))
        monkeypatch.setattr(compute_dtype, "cuda_bf16_native", lambda: cuda_bf16)
        monkeypatch.setattr(configure, "_cuda", lambda: False)

    return stub


@pytest.mark.parametrize(
    ("flags", "device", "cuda_bf16", "dtype", "reason"),
    [
        (AMX_CPU, "cpu", False, "bfloat16", "CPU has AMX: amx_bf16 and amx_tile flags"),
        (AVX512_BF16_CPU, "cpu", False, "bfloat16", "CPU has AVX512-BF16: bf16 measured 2.9x"),
        (AVX2_CPU, "cpu", False, "float32", "CPU without AMX or AVX512-BF16: bf16 matmuls are emulated"),
        ("amx_tile amx_int8", "cpu", False, "float32", "CPU without AMX or AVX512-BF16"),  # AMX without bf16 tiles
        ("", "cpu", False, "float32", "CPU without AMX"),  # no /proc/cpuinfo (macOS, Windows)
        (AVX2_CPU, "cuda", True, "bfloat16", "CUDA GPU with native bf16"),
        (AMX_CPU, "cuda:1", True, "bfloat16", "CUDA GPU with native bf16"),  # the GPU decides, not the host CPU
        (AMX_CPU, "cuda", False, "float32", "CUDA GPU without native bf16, compute capability below 8.0"),
    ],
    ids=["amx", "avx512-bf16", "avx2", "amx-int8-only", "no-flags", "cuda", "cuda-on-amx-host", "cuda-pre-ampere"],
)
def test_auto_resolves_per_machine_kind(machine, flags, device, cuda_bf16, dtype, reason):
    machine(flags, cuda_bf16)
    got, why = resolve_compute_dtype("auto", device)
    assert got == dtype and why.startswith(reason), why
    assert compute_dtype_on("auto", torch.device(device)) == getattr(torch, dtype)


@pytest.mark.parametrize("requested", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("flags", [AMX_CPU, AVX2_CPU], ids=["amx", "avx2"])
def test_a_named_dtype_is_kept_on_every_machine(machine, flags, requested):
    machine(flags, cuda_bf16=True)
    for device in ("cpu", "cuda"):
        assert resolve_compute_dtype(requested, device) == (requested, f"model.dtype={requested} set in the config")


@pytest.mark.parametrize(
    ("flags", "warned"), [(AVX2_CPU, True), (AVX512_BF16_CPU, False), (AMX_CPU, False), ("", False)]
)
def test_bf16_asked_for_on_a_cpu_that_emulates_it_runs_with_a_warning(machine, caplog, flags, warned):
    machine(flags)  # "": flags unreadable (macOS, Windows): nothing is known, nothing is said
    with caplog.at_level(logging.WARNING, logger="search_rl.models.compute_dtype"):
        assert compute_dtype_on("bfloat16", "cpu") == torch.bfloat16  # kept: the user asked for it
        compute_dtype_on("float32", "cpu")
    assert ("bf16 is emulated there" in caplog.text) == warned
    assert len(caplog.records) == int(warned)


def test_auto_on_another_device_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"model\.dtype=auto: no rule for device 'meta'; set model\.dtype="):
        resolve_compute_dtype("auto", "meta")


def test_cpu_flags_come_from_proc_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {AMX_CPU}\n\nprocessor\t: 1\nflags\t: fpu")
    monkeypatch.setattr(compute_dtype, "CPUINFO", info)
    assert cpu_flags() == frozenset(AMX_CPU.split())  # the first processor's line
    info.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # an ARM cpuinfo names them otherwise
    assert cpu_flags() == frozenset()
    monkeypatch.setattr(compute_dtype, "CPUINFO", tmp_path / "absent")
    assert cpu_flags() == frozenset()


def test_the_config_resolves_auto_before_anything_reads_it(machine, caplog):
    machine(AVX2_CPU)
    cfg = load_config(["model=tiny", "trainer.device=cpu"])
    assert cfg.model.dtype == "float32" and cfg.model.dtype_reason.startswith("CPU without AMX")
    assert cfg.engine_matches_trainer and cfg.algorithm.tis_cap == 0.0  # the float32 HF engine samples as it trains

    machine(AMX_CPU)
    with caplog.at_level(logging.INFO, logger="search_rl.configure"):
        cfg = load_config(["model=tiny", "trainer.device=auto"])
    assert cfg.model.dtype == "bfloat16" and cfg.model.dtype_reason.startswith("CPU has AMX")
    assert "model.dtype=auto -> bfloat16 (CPU has AMX: amx_bf16 and amx_tile flags" in caplog.text
    assert not cfg.engine_matches_trainer and cfg.algorithm.tis_cap == 2.0  # bf16 rounds the two apart
    assert load_config(["model=tiny"], config_name="sft_trainer").model.dtype == "bfloat16"
    assert load_config(["model=tiny"], config_name="eval").model.dtype == "bfloat16"
    named = load_config(["model=tiny", "trainer.device=cpu", "model.dtype=float32"])
    assert (named.model.dtype, named.model.dtype_reason) == ("float32", "model.dtype=float32 set in the config")


def test_a_cluster_leaves_auto_to_each_worker(machine, caplog):
    machine(AVX2_CPU)  # the driver's CPU says nothing of the nodes'
    with caplog.at_level(logging.INFO, logger="search_rl.configure"):
        cfg = load_config(["model=tiny", "trainer.device=cpu", "trainer.ray_address=auto"])
    assert cfg.model.dtype == "auto" and "resolved by each worker for its own device" in caplog.text
    assert not cfg.engine_matches_trainer and cfg.algorithm.tis_cap == 2.0  # a node may compute in bf16
    machine(AMX_CPU)  # a worker on an AMX node
    assert compute_dtype_on(cfg.model.dtype, torch.device("cpu")) == torch.bfloat16


def test_diagnose_prints_the_compute_dtype_and_why(machine):
    machine(AMX_CPU)
    assert diagnose.compute_dtype_line("cpu") == (
        "- compute dtype: bfloat16 (CPU has AMX: amx_bf16 and amx_tile flags, bf16 matmuls run on its tile units; "
        "model.dtype=auto on this machine's cpu)"
    )
    machine(AVX2_CPU, cuda_bf16=False)
    lines = diagnose.hardware()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert lines[-1] == diagnose.compute_dtype_line(device) and lines[-1].startswith("- compute dtype: float32 (")
