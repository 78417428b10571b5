"""``model.dtype=auto``: bfloat16 compute where the machine computes it faster, float32 elsewhere.

``resolve_compute_dtype(requested, device)`` is the one place that decides; ``configure.resolve`` calls it when the
config knows the device, and a worker calls it for its own device when the config could not (a remote Ray cluster).

What it picks, per machine kind, and why:

- a CUDA GPU with native bf16 (compute capability 8.0 or newer): ``bfloat16`` (tensor cores); an older GPU
  emulates bf16: ``float32``.
Each CPU rule follows a measurement of ``bench/cpu_dtype_bench.py`` (rows in bench/README.md, "bf16 or float32 on
this CPU") or of ``main_sft`` itself:

- a CPU with AMX (``amx_bf16`` and ``amx_tile`` in ``/proc/cpuinfo``'s flags): ``bfloat16``. Measured on a
  colleague's 2-core machine whose flags list ``amx_bf16 amx_tile amx_int8 avx512_bf16`` (torch 2.13, 2026-11-27),
  not on this repository's reference machine: bf16 matmuls 12.5x float32's for a SmolLM2 projection and 2.3x for
  the LM head; SmolLM2-135M forward + backward 1.9x with autocast; ``main_sft`` with the demo's settings 1.6x with
  ``model.dtype=bfloat16`` (NLL 1.10 vs 1.15 after step 3).
- a CPU with AVX512-BF16 but no AMX: ``bfloat16``. ``bench/cpu_dtype_bench.py`` on a 2-core AMD EPYC whose flags
  list ``avx512_bf16`` and no AMX (torch 2.13, 2026-12-05): bf16 2.7x float32's speed at a SmolLM2 projection, 4.5x
  at the LM head, 2.9x for the policy's forward + backward (2.55x with all 30 layers); on the same machine
  ``bench/dtype_speedup_bench.py`` ran the demo's warm start 2.1x and its GRPO step 1.46x faster with ``auto``
  than with float32, same run.
- any other CPU: ``float32``. On the 2-core AMD EPYC reference machine (AVX2 only; torch 2.13)
  ``bench/cpu_dtype_bench.py`` measured a bf16 SmolLM2 projection at 0.03x float32's speed (2026-11-29): bf16 is
  emulated there. A CPU whose flags this cannot read (macOS, Windows, ARM's ``Features``) also gets ``float32``;
  run the bench there and set ``model.dtype=bfloat16`` where its verdict says ``bf16``.

bf16 is only the compute dtype: trained weights and optimizer state stay fp32 (``workers.distributed``), and the
log-softmax, log-probs, entropies, losses and the sampler run on float32 logits (``workers.forward``,
``workers.chunked_logprobs``, the engines' ``.float()`` on the last logits); the matmuls, the LM head's included, run
in bf16.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from search_rl.models.loading import dtype_of

logger = logging.getLogger(__name__)

AUTO = "auto"
"""The ``model.dtype`` value resolved per machine."""

AMX_FLAGS = ("amx_bf16", "amx_tile")
"""``/proc/cpuinfo`` flags of a CPU whose AMX units multiply bf16 tiles (Intel Sapphire Rapids and later)."""

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (its first ``flags`` line); empty where there is no such file
    (macOS, Windows) or it lists none: such a CPU gets ``float32``."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cuda_bf16_native() -> bool:
    """Whether this process's CUDA device multiplies bf16 natively (compute capability 8.0+, not emulated)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_compute_dtype(requested: str, device: str | torch.device) -> tuple[str, str]:
    """The compute dtype ``model.dtype=requested`` means on ``device``, and why.

    Args:
        requested: ``auto``, or a dtype name (``float32``, ``bfloat16``, ``float16``), returned as it is.
        device: where the model computes: ``cpu`` or ``cuda`` (an index such as ``cuda:1`` is ignored). The CPU's
            flags and the GPU's bf16 support are read from this process's machine (``cpu_flags``,
            ``cuda_bf16_native``), so resolve where the model runs.

    Returns:
        ``(dtype name, reason)``, e.g. ``("bfloat16", "CPU has AMX: amx_bf16 and amx_tile flags, ...")``.

    Raises:
        ValueError: ``auto`` on a device that is neither CPU nor CUDA.
    """
    if requested != AUTO:
        return requested, f"model.dtype={requested} set in the config"
    kind = torch.device(device).type
    if kind == "cuda":
        if cuda_bf16_native():
            return "bfloat16", "CUDA GPU with native bf16: tensor cores"
        return "float32", "CUDA GPU without native bf16, compute capability below 8.0: bf16 would be emulated"
    if kind != "cpu":
        raise ValueError(f"model.dtype=auto: no rule for device {device!r}; set model.dtype=float32 or bfloat16")
    flags = cpu_flags()
    if all(f in flags for f in AMX_FLAGS):
        return "bfloat16", f"CPU has AMX: {' and '.join(AMX_FLAGS)} flags, bf16 matmuls run on its tile units"
    if "avx512_bf16" in flags:
        return "bfloat16", "CPU has AVX512-BF16: bf16 measured 2.9x float32's for the policy's forward + backward there"
    return "float32", "CPU without AMX or AVX512-BF16: bf16 matmuls are emulated there, far slower than float32"


def bf16_emulated_on_cpu() -> bool:
    """Whether this CPU's flags are readable and name neither AMX nor AVX512-BF16: bf16 is emulated there (0.03x
    float32's speed on the AVX2 reference machine)."""
    flags = cpu_flags()
    return bool(flags) and not all(f in flags for f in AMX_FLAGS) and "avx512_bf16" not in flags


def compute_dtype_on(requested: str, device: str | torch.device) -> torch.dtype:
    """The torch dtype of ``resolve_compute_dtype``: what a worker or engine on ``device`` computes in, logging the
    choice when ``auto`` was still unresolved (the config did not know the device: a cluster's node), and warning
    when ``bfloat16`` was asked for on a CPU that emulates it (it runs, far slower than float32)."""
    name, reason = resolve_compute_dtype(requested, device)
    kind = torch.device(device).type
    if requested == AUTO:
        logger.info("model.dtype=auto -> %s on this process's %s (%s)", name, kind, reason)
    elif name == "bfloat16" and kind == "cpu" and bf16_emulated_on_cpu():
        logger.warning(
            "model.dtype=bfloat16 on a CPU without AMX or AVX512-BF16: bf16 is emulated there, many times slower "
            "than float32 (bench/cpu_dtype_bench.py); model.dtype=auto picks float32 on this CPU"
        )
    return dtype_of(name)
