"""Model loading: the packaged SmolLM2 GGUF (cached conversion), local HF directories, hub ids (from the HF cache
offline), the tiny random model."""

from search_rl.models.loading import (
    SMOLLM2,
    cache_root,
    dtype_of,
    load_model,
    load_tokenizer,
    model_context_length,
    model_dir,
    smollm2_gguf_path,
)
from search_rl.models.tiny import build_tiny_model

__all__ = [
    "SMOLLM2",
    "build_tiny_model",
    "cache_root",
    "dtype_of",
    "load_model",
    "load_tokenizer",
    "model_context_length",
    "model_dir",
    "smollm2_gguf_path",
]
