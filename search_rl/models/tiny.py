"""A tiny random Llama for fast tests and smoke runs: 2 layers, small width, the real tokenizer's vocabulary."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def tiny_llama_config(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int = 64, num_layers: int = 2) -> LlamaConfig:
    """Config of the tiny model, with vocabulary and special tokens taken from ``tokenizer``."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2
) -> LlamaForCausalLM:
    """Random ``LlamaForCausalLM``, identical for the same ``seed`` (the global RNG is left untouched)."""
    cfg = tiny_llama_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()
