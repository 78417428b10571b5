"""Moving whole weights between copies of one model: tied names found by identity, loads, HF folder export.

A model with tied embeddings (SmolLM2, Qwen2.5-3B, Llama-3.2-3B) has one tensor under two state-dict names
(``model.embed_tokens.weight`` and ``lm_head.weight``). ``state_dict()`` lists both, ``named_parameters()`` only
the first, and a state dict gathered from shards holds two equal but separate copies. So aliases are never found by
a list of names: they are the names under which a module holds the *same tensor object*.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedTokenizerBase


def tensor_aliases(module: nn.Module) -> dict[str, str]:
    """``{alias: canonical}`` for every state-dict name of ``module`` that holds the same tensor object as an
    earlier name (tied weights); empty for a model without ties. Works on sharded (FSDP2) modules too."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        key = id(tensor)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def without_aliases(state: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """``state`` less the alias names (each tied tensor once, under its canonical name)."""
    return {k: v for k, v in state.items() if k not in aliases}


def load_weights(module: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy ``named_tensors`` into ``module``'s tensors of the same state-dict names (cast to their dtype and
    device); returns how many distinct tensors were written.

    A tied tensor may come under any of its names, once or more. Every tensor of ``module``'s state dict must be
    written, so a partial update never leaves stale weights behind.

    Raises:
        KeyError: a name ``module`` does not have, or tensors of ``module`` that nothing was written to.
        ValueError: a shape mismatch.
    """
    own = module.state_dict(keep_vars=True)
    written: set[int] = set()
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in own:
                raise KeyError(f"load_weights: the model has no tensor named {name!r}")
            target = own[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"load_weights: {name} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)}"
                )
            target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
            written.add(id(target))
    missing = sorted(name for name, t in own.items() if id(t) not in written)
    if missing:
        raise KeyError(f"load_weights: no tensor was given for {missing[:5]}{' …' if len(missing) > 5 else ''}")
    return len(written)


def save_hf_folder(
    directory: str | Path,
    state: Mapping[str, torch.Tensor],
    config: PretrainedConfig,
    *,
    aliases: Mapping[str, str] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an HF model folder (``config.json`` + ``model.safetensors``) from a full (unsharded) state dict.

    Alias names are left out (``from_pretrained`` re-ties them from the config), tensors are written contiguous on
    CPU, in ``dtype`` when given. The folder loads with plain ``AutoModelForCausalLM.from_pretrained`` and with vLLM.
    """
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
        for k, v in without_aliases(state, aliases or {}).items()
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = config.__class__.from_dict(config.to_dict())  # a copy: the dtype written is the file's
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    (path / "search_rl_export.json").write_text(json.dumps({"tensors": len(tensors), "aliases": dict(aliases or {})}))
    return path
