"""The static engine's forward: Llama and Qwen2 (SmolLM2, Qwen2.5, Llama 3) written for decoding, over the HF model's
own parameters.

transformers' modules cost 40-50 small kernels a layer on a decode step (separate q/k/v projections, RMSNorm and
RoPE as several ops each, two KV writes, an additive float mask over the padded width). This forward computes the
same function with fewer, larger kernels:

- q/k/v and gate/up are one projection each: their weights are concatenated once and the HF parameters become views
  of the fused tensor (``fuse_rows``), so an in-place weight update (``load_weights``, which copies into ``.data``)
  updates the fused weights too, and nothing is held twice;
- RMSNorm is fused with the residual add that precedes it; RoPE reads a cos/sin table made once by the model's own
  rotary module, so a scaling whose cos/sin depend only on the position (``ROPE_TYPES``: linear, llama3, yarn with
  its attention factor, which transformers folds into cos/sin) is reproduced exactly;
- attention reads each row's cache columns up to the batch's width with a boolean mask, the query heads of a group
  packed as rows of their KV head's attention (grouped KV heads are never repeated);
- only the last position's logits are computed.

``check_supported`` refuses what this forward does not model (sliding windows, logit soft-capping, other families,
RoPE types outside ``ROPE_TYPES``), naming the setting. Exactness against the HF forward, every RoPE type included, is
tested in float32 (``tests/search_rl/rollout/test_lean_decoder.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from search_rl.rollout.engines.static.slot_cache import SlotCache

MODEL_TYPES = ("llama", "qwen2")
"""Model families the forward implements (``config.model_type``)."""

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""RoPE types the forward reproduces (``rope_type`` of ``config.rope_parameters``, or the legacy ``rope_scaling``
``type``): their cos/sin depend only on the position, so the table made once by the model's rotary module is exact. Each
is compared with transformers' forward in the tests; other types are refused."""

_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
"""RoPE types whose frequencies transformers recomputes from the sequence length on each forward (no fixed table)."""


def _rope_type(config: PretrainedConfig) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default")


def unsupported_reasons(config: PretrainedConfig) -> list[str]:
    """What in ``config`` the lean forward would compute wrongly; empty when it models the whole config."""
    text = config.get_text_config(decoder=True)
    reasons = []
    if text.model_type not in MODEL_TYPES:
        reasons.append(f"model_type {text.model_type!r} (implemented: {', '.join(MODEL_TYPES)})")
    layer_types = getattr(text, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(text, "use_sliding_window", False):
        reasons.append(f"sliding-window attention (sliding_window={getattr(text, 'sliding_window', None)})")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(text, name, None):
            reasons.append(f"logit soft-capping ({name}={getattr(text, name)})")
    if (rope := _rope_type(text)) not in ROPE_TYPES:
        dynamic = any(t in rope for t in _LENGTH_DEPENDENT_ROPE)
        why = "its cos/sin depend on the sequence length" if dynamic else "not compared with transformers' forward"
        reasons.append(f"RoPE type {rope!r} ({why}; supported: {', '.join(ROPE_TYPES)})")
    if (tp := getattr(text, "pretraining_tp", 1) or 1) != 1:
        reasons.append(f"pretraining_tp={tp}")
    if getattr(text, "hidden_act", "silu") != "silu":
        reasons.append(f"hidden_act {text.hidden_act!r} (implemented: silu)")
    return reasons


def check_supported(config: PretrainedConfig) -> None:
    """Refuse a model the lean forward does not model.

    Raises:
        ValueError: naming each unsupported setting and the engine to use instead.
    """
    if reasons := unsupported_reasons(config):
        raise ValueError(
            "rollout.engine=static models Llama/Qwen2 attention only; this model has "
            + "; ".join(reasons)
            + ". Use rollout.engine=hf (any transformers model) or vllm"
        )


def fuse_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) holding ``linears``' rows in order; each layer's parameters become views of it.

    Already fused (the parameters are adjacent rows of one storage, e.g. a second engine over the same model): the
    fused tensor is returned without a copy.

    Raises:
        ValueError: some of the projections have a bias and some do not.
    """
    biases = [lin.bias for lin in linears]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        raise ValueError("fuse_rows: some of the fused projections have a bias and some do not")
    with torch.no_grad():
        weight = _fuse([lin.weight for lin in linears])
        bias = None if biases[0] is None else _fuse([b for b in biases if b is not None])
    return weight, bias


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """The tensor whose rows are ``params`` in order, rebinding each parameter's ``.data`` as a view of it."""
    first = params[0]
    rows = sum(p.shape[0] for p in params)
    storage = first.untyped_storage().data_ptr()
    offset, adjacent = first.storage_offset(), first.is_contiguous()
    for p in params:
        adjacent &= p.is_contiguous() and p.untyped_storage().data_ptr() == storage and p.storage_offset() == offset
        offset += p.numel()
    if adjacent:
        return first.data.as_strided((rows, *first.shape[1:]), first.stride())
    whole = torch.cat([p.data for p in params], dim=0)
    start = 0
    for p in params:
        p.data = whole[start : start + p.shape[0]]
        start += p.shape[0]
    return whole


@dataclass
class _Layer:
    """One decoder layer's tensors (views of the HF parameters)."""

    in_norm: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None


def add_rms_norm(
    h: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += h`` (or ``residual = h`` first), then RMSNorm of it as transformers computes it (float32
    statistics, scaled in the input dtype); returns (normed, residual)."""
    residual = h if residual is None else residual + h
    x = residual.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(residual.dtype), residual


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` (..., D) with per-position cos/sin (..., D), as transformers' ``apply_rotary_pos_emb``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def gated(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of a fused (..., 2I) gate/up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class LeanDecoder:
    """The forward of a Llama/Qwen2 causal LM for prefill and decode into a slot KV cache.

    Args:
        model: the HF model; its q/k/v and gate/up parameters are rebound as views of fused tensors (in place: the
            model keeps working as before, and in-place weight updates reach this forward).
        max_positions: positions the RoPE table covers (the engine's context length).
        compiled: ``torch.compile`` the elementwise parts (norm with residual add, RoPE, gated activation) into
            fused kernels, each once for any shape (``dynamic=True``).

    Raises:
        ValueError: the model is not one this forward models (``check_supported``).
    """

    def __init__(self, model: PreTrainedModel, max_positions: int, compiled: bool = False) -> None:
        check_supported(model.config)
        text = model.config.get_text_config(decoder=True)
        self.model = model
        self.heads = int(text.num_attention_heads)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // self.heads)
        self.eps = float(text.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self.max_positions = max_positions
        self.compiled = compiled
        fuse = (lambda fn: torch.compile(fn, dynamic=True, fullgraph=True)) if compiled else (lambda fn: fn)
        self._add_norm, self._rotate, self._gated = fuse(add_rms_norm), fuse(rotate), fuse(gated)
        self._bind()

    def _bind(self) -> None:
        """Fuse the projections and take the views this forward reads; remember where they live (``intact``)."""
        inner: Any = self.model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        head = self.model.get_output_embeddings()
        assert head is not None and getattr(head, "bias", None) is None, "a bias-free output head"
        self.head = head.weight
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_w, qkv_b = fuse_rows([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up_w, gate_up_b = fuse_rows([mlp.gate_proj, mlp.up_proj])
            self.layers.append(
                _Layer(
                    layer.input_layernorm.weight,
                    qkv_w,
                    qkv_b,
                    attn.o_proj.weight,
                    attn.o_proj.bias,
                    layer.post_attention_layernorm.weight,
                    gate_up_w,
                    gate_up_b,
                    mlp.down_proj.weight,
                    mlp.down_proj.bias,
                )
            )
        self._where = self._addresses()
        positions = torch.arange(self.max_positions, device=self.embed.device)[None]  # (1, P)
        probe = torch.zeros((), dtype=self.embed.dtype, device=self.embed.device)
        with torch.no_grad():
            cos, sin = inner.rotary_emb(probe, positions)  # (1, P, D) each, in the model's dtype
        self.cos, self.sin = cos[0], sin[0]

    def _addresses(self) -> tuple[tuple[int, torch.dtype, torch.device], ...]:
        params = [p for _, p in self.model.named_parameters()]
        return tuple((p.data_ptr(), p.dtype, p.device) for p in params)

    def intact(self) -> bool:
        """Whether every parameter still lives where this forward reads it (a ``.to()`` or a ``param.data = ...``
        elsewhere would have moved it)."""
        return self._addresses() == self._where

    def rebind(self) -> None:
        """Fuse and take the views again after the model's parameters moved (``intact()`` was false)."""
        self._bind()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        rows: torch.Tensor | None,
        cols: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        """Run new tokens through the model into the cache; return the last position's logits (R, V) in float32.

        Args:
            input_ids: (R, S) new tokens.
            positions: (R, S) their positions (RoPE).
            cache: per-layer (slots, kv_heads, length, head_dim) keys and values.
            rows: (R,) slot of each row; None = rows are slots ``0..R-1`` (the decode step: views, not gathers).
            cols: (R, S) cache column each token is written to (its position; padding goes to the scratch column).
            width: columns read back (every real query's columns are below it).
        """
        n, s = input_ids.shape
        visible = torch.arange(width, device=cols.device) <= cols[:, :, None]  # (R, S, W) causal, per row
        group = self.heads // self.kv_heads
        mask = visible[:, None, None].expand(n, 1, group, s, width).reshape(n, 1, group * s, width)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (R, 1, S, D)
        h = F.embedding(input_ids, self.embed)  # (R, S, H)
        residual: torch.Tensor | None = None
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        write_rows = (torch.arange(n, device=cols.device) if rows is None else rows)[:, None]  # (R, 1)
        for i, layer in enumerate(self.layers):
            x, residual = self._add_norm(h, residual, layer.in_norm, self.eps)
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b)  # (R, S, (H + 2 KVH) D)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = self._rotate(q.view(n, s, self.heads, self.head_dim).transpose(1, 2), cos, sin)  # (R, H, S, D)
            k = self._rotate(k.view(n, s, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)  # (R, KVH, S, D)
            keys, values = cache.kv(i)
            # advanced indices split by a slice put their dims first: the target is (R, S, KVH, D)
            keys[write_rows, :, cols] = k.transpose(1, 2)
            values[write_rows, :, cols] = v.view(n, s, self.kv_heads, self.head_dim)
            if rows is None:
                k_all, v_all = keys[:n, :, :width], values[:n, :, :width]  # (R, KVH, W, D) views
            else:
                k_all, v_all = keys[rows, :, :width], values[rows, :, :width]
            packed = q.reshape(n, self.kv_heads, group * s, self.head_dim)  # head h = kv_head * G + g
            out = F.scaled_dot_product_attention(packed, k_all, v_all, attn_mask=mask, scale=self.scale)
            out = out.view(n, self.heads, s, self.head_dim).transpose(1, 2).reshape(n, s, q_size)
            h = F.linear(out, layer.o_w, layer.o_b)
            x, residual = self._add_norm(h, residual, layer.post_norm, self.eps)
            h = F.linear(self._gated(F.linear(x, layer.gate_up_w, layer.gate_up_b)), layer.down_w, layer.down_b)
        last = residual[:, -1:] if residual is not None else None
        x, _ = self._add_norm(h[:, -1:], last, self.final_norm, self.eps)
        return F.linear(x[:, 0], self.head).float()  # (R, V)
