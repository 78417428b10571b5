"""What one static-engine ``generate`` call holds while it decodes: per slot on the device, per sequence on the host.

``DecodeState`` is the device side, one row per KV-cache slot: each slot's newest token, its next cache column, its
token budget and sampling stream, and the tokens and log-probs it has sampled. A decode step reads and writes only
these tensors, in place, so their shapes and addresses stay fixed from step to step (what a captured CUDA graph
replays); ``advance`` is the step's sampling and EOS/length marking, with no host sync. ``CallState`` is the host
side, one entry per sequence of the call: its prompt, budget and stream, the tokens read back so far (``take``),
and its result once it ended (``finish``: EOS, length or a stop string, with what followed the stop cut).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from search_rl.datatypes import Generated, SamplingParams
from search_rl.rollout.engines.decoding import StopTails, counter_uniforms, finish_reason, sample_tokens


@dataclass
class CallState:
    """One ``generate`` call's sequences: prompts, limits, sampling streams, and what each has sampled."""

    prompts: list[list[int]]
    limits: list[int]
    params: SamplingParams
    streams: list[int]
    tokens: list[list[int]] = field(default_factory=list)
    logps: list[list[float]] = field(default_factory=list)
    results: list[Generated | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        self.tokens, self.logps, self.results = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n

    def take(self, state: DecodeState, seqs: list[int]) -> list[int]:
        """Append the new tokens (and log-probs, if asked) of slots ``0..len(seqs)-1`` to their sequences ``seqs``;
        returns how many tokens each sequence had before (one readback for all of them)."""
        live = len(seqs)
        n_gen = state.n_gen[:live].tolist()
        have = [len(self.tokens[i]) for i in seqs]
        lo, hi = min(have), max(n_gen)
        toks = state.out_tok[:live, lo:hi].tolist()
        lps = state.out_lp[:live, lo:hi].tolist() if self.params.logprobs else None
        for s, i in enumerate(seqs):
            self.tokens[i] += toks[s][have[s] - lo : n_gen[s] - lo]
            if lps is not None:
                self.logps[i] += lps[s][have[s] - lo : n_gen[s] - lo]
        return have

    def finish(self, i: int, start: int, screen: StopTails, eos_token_ids: tuple[int, ...]) -> bool:
        """Whether sequence ``i`` ended at one of its tokens from ``start`` on (``screen``: the call's stop strings);
        if so cut what follows and record its result."""
        tokens, params = self.tokens[i], self.params
        for j in range(start, len(tokens)):
            tail = screen.tails([tokens[max(0, j + 1 - screen.window) : j + 1]])[0]
            reason, stop_str = finish_reason(tokens[j], tail, params.stop, j + 1, self.limits[i], eos_token_ids)
            if reason is None:
                continue
            del tokens[j + 1 :]
            del self.logps[i][j + 1 :]
            lp = tuple(self.logps[i]) if params.logprobs else None
            self.results[i] = Generated(tuple(tokens), reason, stop_str, lp)
            return True
        return False


class DecodeState:
    """Per-slot decode state on the device: what the captured step reads and writes.

    ``tok`` is each slot's newest sampled token, to be written at cache column ``pos``; ``n_gen`` tokens are in
    ``out_tok`` / ``out_lp``; ``done`` slots (finished on the device, or idle) no longer advance.
    """

    def __init__(self, slots: int, length: int, device: torch.device) -> None:
        long = torch.long
        self.tok = torch.zeros(slots, dtype=long, device=device)  # (slots,)
        self.pos = torch.full((slots,), length - 1, dtype=long, device=device)  # (slots,) idle: the scratch column
        self.n_gen = torch.zeros(slots, dtype=long, device=device)  # (slots,)
        self.limit = torch.ones(slots, dtype=long, device=device)  # (slots,)
        self.stream = torch.zeros(slots, dtype=long, device=device)  # (slots,)
        self.done = torch.ones(slots, dtype=torch.bool, device=device)  # (slots,)
        self.out_tok = torch.zeros((slots, length), dtype=long, device=device)  # (slots, T)
        self.out_lp = torch.zeros((slots, length), dtype=torch.float32, device=device)  # (slots, T)
        self.scratch = length - 1

    def _tensors(self) -> list[torch.Tensor]:
        return [self.tok, self.pos, self.n_gen, self.limit, self.stream, self.done, self.out_tok, self.out_lp]

    def snapshot(self) -> Callable[[], None]:
        """Save every tensor; the returned function puts the saved values back (in place)."""
        saved = [t.clone() for t in self._tensors()]

        def restore() -> None:
            for t, s in zip(self._tensors(), saved, strict=True):
                t.copy_(s)

        return restore

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s state into slot ``dst``."""
        for t in self._tensors():
            t[dst] = t[src]

    def free(self, slot: int) -> None:
        """Make ``slot`` idle: done, writing the scratch column."""
        self.done[slot], self.pos[slot], self.tok[slot], self.n_gen[slot] = True, self.scratch, 0, 0

    def advance(self, logits: torch.Tensor, rows: torch.Tensor, params: SamplingParams, eos_ids: torch.Tensor) -> None:
        """Sample one token for each slot in ``rows`` (R,) from its logits (R, V), record it, and mark EOS
        (``eos_ids``, on the device) and length stops, all on the device (no host sync: this runs inside a captured
        step)."""
        n = self.n_gen[rows]  # (R,)
        live = ~self.done[rows]  # (R,)
        uniforms = None if params.greedy else counter_uniforms(self.stream[rows], n)
        tok, lp = sample_tokens(logits, params, None, uniforms)  # (R,), (R,)
        col = n.clamp(max=self.out_tok.shape[1] - 1)
        self.out_tok[rows, col] = torch.where(live, tok, self.out_tok[rows, col])
        self.out_lp[rows, col] = torch.where(live, lp, self.out_lp[rows, col])
        n = n + live.long()
        finished = live & (torch.isin(tok, eos_ids) | (n >= self.limit[rows]))
        self.n_gen[rows] = n
        self.done[rows] = self.done[rows] | finished
        self.pos[rows] = torch.where(live, self.pos[rows] + 1, self.pos[rows])  # the new token goes to the next column
        self.tok[rows] = torch.where(live, tok, self.tok[rows])
