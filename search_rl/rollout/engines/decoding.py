"""What the in-process engines share per decode step: sampling a token per row, deciding whether a row is finished,
copying a finished row's KV states, the order rows close up in when some finish (``fill_holes``), and the hook that
may rewrite logits."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

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


def fill_holes(keep: list[int], rows: int) -> list[int]:
    """The rows ``keep`` (ascending, out of ``rows``) in the order that moves the fewest: a kept row below
    ``len(keep)`` stays where it is, and each place a leaving row frees there takes a kept row from beyond it."""
    kept, movers = set(keep), iter(r for r in keep if r >= len(keep))
    assert len(kept) == len(keep) and all(0 <= r < rows for r in keep)
    return [r if r in kept else next(movers) for r in range(len(keep))]


class StopTails:
    """Decoded tails of the rows whose newest token can complete a stop string; ``""`` for the others.

    A stop string is complete only once the token carrying its last character arrives, and the engines end a sample
    at its first complete stop string, so a row needs decoding only when its newest token's text contains the last
    character of some stop string. That set of token ids is found once per tokenizer and stop tuple by decoding the
    vocabulary; most decode steps then decode no row (on 2 CPU cores, decoding 64 tails took ~2 ms a step). A stop
    string ending in a non-ASCII character (which byte-level tokens may split) turns the screen off: every row is
    decoded, as before.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.window = max((len(s) for s in stops), default=0) + 2
        """Tokens decoded per row: enough to hold the longest stop string."""
        last = {s[-1] for s in stops if s}
        self.enders: frozenset[int] | None = None
        """Token ids whose text holds a stop string's last character (None: every token may end one)."""
        if all(c.isascii() for c in last):
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
            self.enders = frozenset(i for i, text in enumerate(texts) if any(c in text for c in last))

    def tails(self, rows: list[list[int]]) -> list[str]:
        """Each row's last ``window`` tokens decoded, or ``""`` where its newest token cannot end a stop string."""
        out = [""] * len(rows)
        if not self.stops:
            return out
        need = [k for k, r in enumerate(rows) if self.enders is None or (r and r[-1] in self.enders)]
        if need:
            for k, text in zip(need, self.tokenizer.batch_decode([rows[k][-self.window :] for k in need]), strict=True):
                out[k] = text
        return out


MASK32 = 0xFFFFFFFF


def _mul32(x: Any, c: int) -> Any:
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32) without an int64 overflow (tensors and Python ints alike)."""
    return (((x & 0xFFFF) * c) + ((((x >> 16) * c) & 0xFFFF) << 16)) & MASK32


def hash32(x: Any) -> Any:
    """A 32-bit integer hash (Wellons' lowbias32) of ``x`` in [0, 2**32), elementwise on int64 tensors or on an int:
    the same bits on every device, and no random state (so it can run inside a captured graph)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_key(seed: int, index: int) -> int:
    """The sampling stream of sequence ``index`` of a call seeded ``seed`` (``counter_uniforms``)."""
    return int(hash32(hash32(hash32(seed & MASK32) ^ ((seed >> 32) & MASK32)) ^ (index & MASK32)))


def counter_uniforms(streams: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform draw in [0, 1) per row from its stream (R,) and its token counter (R,) (int64 tensors): a pure
    function of the two, so a sequence's samples depend on neither the batch it shares nor the device's RNG."""
    bits = hash32(hash32(streams ^ (counters & MASK32)) ^ 0x9E3779B9)  # (R,) in [0, 2**32)
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 bits: exact in float32, never 1.0


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
    noise_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (token ids (R,), their log-probs (R,)).

    Without ``uniforms``: an exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)`` per vocabulary entry drawn from
    ``gen`` (token i wins with probability p_i), what ``torch.multinomial`` does, but with ``torch.rand`` and a log:
    19 ms instead of 76 ms for 64 rows of SmolLM2's 49k vocabulary on 2 CPU cores. Like multinomial, a tiny change in
    the logits (a prefix-cached vs recomputed forward) almost never changes the winner.
    With ``uniforms`` (R,) in [0, 1): one draw per row from that row's own stream, turned into its token by inverse
    CDF, so a row's sample does not depend on which other rows share the batch (continuous batching).
    ``noise_rows`` (R,): row j takes the race drawn for row ``noise_rows[j]`` (the draws keep their order), so rows
    may be reordered without changing which sample gets which draw."""
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
        race = torch.rand(probs.shape, generator=gen, device=probs.device).log_().neg_()  # (R, V) ~ Exp(1)
        if noise_rows is not None:
            race = race[noise_rows]
        tok = (probs / race).argmax(dim=-1)  # (R,); a filtered token (p = 0) never wins
    else:
        cdf = probs.cumsum(dim=-1)  # (R, V)
        target = uniforms.to(cdf)[:, None] * cdf[:, -1:]  # scaled by the total, which rounding leaves near 1
        tok = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)  # (R,)
        # rounding can put the target at the very end, past the last token with probability: take the likeliest
        tok = torch.where(probs.gather(-1, tok[:, None])[:, 0] > 0, tok, probs.argmax(dim=-1))
    return tok, logp.gather(-1, tok[:, None])[:, 0]
