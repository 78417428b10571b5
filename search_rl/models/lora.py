"""LoRA adapters on the policy (``model.lora_rank > 0``), through ``peft``.

The base weights stay frozen; only the adapters train (and carry AdamW state). Three consequences the workers use:

- The reference policy is the base with the adapters disabled (``reference_forward``): no second model in memory.
- Engines (HF, vLLM) and evaluation get plain weights: ``merged_state_dict`` folds ``W + (alpha / r) * B @ A`` into
  each adapted layer and strips peft's prefixes, so the result loads into the base architecture by its own names.
- Checkpoints hold the adapters (``adapter_state_dict``, enough to resume on top of ``model.path``) and the merged
  model (an HF folder, what ``main_eval`` and vLLM load).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

PEFT_PREFIX = "base_model.model."
"""Prefix ``peft`` puts before the wrapped model's parameter names."""
ADAPTER = "default"
"""The adapter's name inside peft (one adapter per policy)."""
ADAPTER_DIR = "actor_lora"
"""A checkpoint's adapter folder, in peft's format (``PeftModel.from_pretrained(base, folder)`` loads it)."""


def apply_lora(model: nn.Module, rank: int, alpha: int, target_modules: str, seed: int = 0) -> nn.Module:
    """Wrap ``model`` with fresh LoRA adapters (B = 0, so the wrapped model computes exactly what ``model`` did);
    only the adapters require gradients.

    Args:
        model: a causal LM (its weights become the frozen base).
        rank: adapter rank r (> 0).
        alpha: scaling numerator (the update is ``alpha / r * B @ A``).
        target_modules: ``all-linear`` (every linear layer but the output head) or comma-separated module names
            such as ``q_proj,v_proj``.
        seed: seeds A's random init (``model.seed``), so a seeded run updates the same adapters every time; the
            global random state is left as it was.
    """
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = (
        target_modules
        if target_modules == "all-linear"
        else [t.strip() for t in target_modules.split(",") if t.strip()]
    )
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    with torch.random.fork_rng(devices=[]):  # A's init draws from the global generator: seed it, then restore it
        torch.manual_seed(seed)
        return get_peft_model(model, config)  # type: ignore[arg-type]


def lora_scaling(model: nn.Module) -> float:
    """``alpha / r`` of ``model``'s adapter."""
    config = getattr(model, "peft_config")[ADAPTER]  # noqa: B009 (peft's attribute, untyped)
    return float(config.lora_alpha) / float(config.r)


def merged_state_dict(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The plain model's state dict from a LoRA-wrapped one's: each adapted ``weight`` becomes
    ``weight + scaling * B @ A`` (computed in fp32, returned in the weight's dtype), adapter tensors are dropped and
    peft's prefixes removed.

    Raises:
        ValueError: an adapter without its base weight (or the reverse), i.e. not a peft LoRA state dict.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        plain = name.removeprefix(PEFT_PREFIX)
        if ".base_layer." in plain:
            layer = name.rsplit(".base_layer.", 1)[0]
            plain = plain.replace(".base_layer.", ".")
            if plain.endswith(".weight"):
                a, b = state.get(f"{layer}.lora_A.{ADAPTER}.weight"), state.get(f"{layer}.lora_B.{ADAPTER}.weight")
                if a is None or b is None:
                    raise ValueError(f"LoRA state dict: {name} has no lora_A/lora_B pair under {layer}")
                delta = (b.float() @ a.float()) * scaling
                tensor = (tensor.float() + delta.to(tensor.device)).to(tensor.dtype)
        out[plain] = tensor
    return out


def save_adapters(model: nn.Module, folder: str | Path, adapters: Mapping[str, torch.Tensor]) -> None:
    """Write ``adapters`` (from ``adapter_state_dict``) in peft's format with ``model``'s adapter config."""
    save = getattr(model, "save_pretrained")  # noqa: B009 (PeftModel's, untyped)
    save(str(folder), state_dict=dict(adapters))


def adapter_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA-wrapped model's state dict (what a checkpoint must keep to resume)."""
    return {name: t for name, t in state.items() if ".lora_A." in name or ".lora_B." in name}


def load_adapters(folder: str | Path, expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a checkpoint's ``folder`` (peft's format), under the wrapped model's names.

    Args:
        folder: written by ``PeftModel.save_pretrained``.
        expected: the wrapped model's state dict; every adapter tensor in it must be in the folder, shapes equal.

    Raises:
        ValueError: the folder's adapters do not fit the model (another rank or target modules), naming the tensor.
    """
    from peft.utils import load_peft_weights

    saved = load_peft_weights(str(folder), device="cpu")
    # peft files drop the adapter name: "...q_proj.lora_A.weight" is "...q_proj.lora_A.default.weight" in the model
    renamed = {
        k.replace(".lora_A.weight", f".lora_A.{ADAPTER}.weight").replace(
            ".lora_B.weight", f".lora_B.{ADAPTER}.weight"
        ): v
        for k, v in saved.items()
    }
    wanted = adapter_state_dict(expected)
    missing, unexpected = sorted(set(wanted) - set(renamed)), sorted(set(renamed) - set(wanted))
    if missing or unexpected:
        raise ValueError(f"{folder}: adapters do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, tensor in renamed.items():
        if tuple(tensor.shape) != tuple(wanted[name].shape):
            raise ValueError(
                f"{folder}: {name} has shape {tuple(tensor.shape)}, the model {tuple(wanted[name].shape)} "
                "(a different model.lora_rank?)"
            )
    return {k: v.to(device=wanted[k].device, dtype=wanted[k].dtype) for k, v in renamed.items()}


@contextlib.contextmanager
def reference_forward(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model`` computes as its frozen base (adapters disabled): the reference policy."""
    with model.disable_adapter():  # type: ignore[operator]
        yield
