"""What the in-process engines share per decode step: sampling a token per row, deciding whether a row is finished,
copying a finished row's KV states, and the hook that may rewrite logits."""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache

from search_rl.datatypes import FinishReason, SamplingParams
from search_rl.rollout.engines.prefix_cache import KV


class LogitsProcessor(Protocol):
    """Hook that may rewrite next-token logits of the active rows.

    Called as ``(prompts, generated, logits)``: each row's prompt ids, the ids it generated so far in this call,
    and its raw logits (R, V); returns logits (R, V).
    """

    def __call__(self, prompts: list[list[int]], generated: list[list[int]], logits: torch.Tensor) -> torch.Tensor: ...


def row_states(cache: DynamicCache, attention: torch.Tensor, row: int, n: int) -> KV:
    """Copies of row ``row``'s KV states at its real (non-padding) columns, which must be ``n``."""
    keep = attention[row].bool()
    assert int(keep.sum()) == n, "KV columns and fed tokens must match"
    return [(layer.keys[row][:, keep], layer.values[row][:, keep]) for layer in cache.layers]  # type: ignore[union-attr,index]


def finish_reason(
    last: int, tail: str, stops: tuple[str, ...], n_generated: int, limit: int, eos: tuple[int, ...]
) -> tuple[FinishReason | None, str | None]:
    """Why a sample ends after its latest token ``last`` (``tail``: its last few tokens decoded), or (None, None) if
    it goes on."""
    if last in eos:
        return "eos", None
    # A stop string cannot have been complete before this token (the sample would have ended), so any stop
    # string found in the decoded tail ends in the latest token.
    found = [s for s in stops if s in tail]
    if found:
        return "stop", min(found, key=tail.find)
    if n_generated >= limit:
        return "length", None
    return None, None


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    gen: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (token ids (R,), their log-probs (R,)).

    ``uniforms`` (R,) in [0, 1): one draw per row from that row's own stream, turned into its token by inverse CDF,
    so a row's sample does not depend on which other rows share the batch (continuous batching); without it,
    ``torch.multinomial`` draws from ``gen``."""
    if params.greedy:
        tok = logits.argmax(dim=-1)  # (R,)
        return tok, torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None])[:, 0]
    scaled = logits / params.temperature  # (R, V)
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = scaled
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # (R, 1)
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(filtered, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) > params.top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    if uniforms is None:
        tok = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (R,)
    else:
        cdf = probs.cumsum(dim=-1)  # (R, V)
        target = uniforms.to(cdf)[:, None] * cdf[:, -1:]  # scaled by the total, which rounding leaves near 1
        tok = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None])[:, 0]
