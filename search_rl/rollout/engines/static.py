"""Static-cache generation backend: the HF engine's contract, with every decode step at fixed shapes and addresses.

The HF engine's decode step is bound by kernel launches and Python on a GPU (~1.8k tokens/s on an H200, whatever
the model size), not by reading the weights. This engine keeps one pre-allocated KV cache of fixed slots
(``slot_cache.SlotCache``), so a decode step has the same shapes and tensor addresses every time; on CUDA it is
captured once as a CUDA graph per (batch, length) bucket and replayed, one launch per token step. Prefill runs
eagerly. Slots are refilled as sequences finish (calls larger than ``max_batch_size`` keep the batch full), a GRPO
group's repeated prompt is encoded once and copied, and the previous call's sequences are reused as prefixes as in
the HF engine. ``update_weights`` copies into the model's tensors in place, so captured graphs stay valid.

Why not transformers' own paths (5.24): ``generate`` with a ``StaticCache`` and ``torch.compile(mode=
"reduce-overhead")`` has no per-sample token limits, keeps finished rows until the whole batch ends and recompiles
per shape; ``generate_batch`` (continuous batching) has no stop strings and no per-call seed, and returns log-probs
after top-p filtering. Both would need the rollout's stop-string and log-prob logic re-done around them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.rollout.engines.base import check_generate_args
from search_rl.rollout.engines.decoding import LogitsProcessor, finish_reason, sample_tokens
from search_rl.rollout.engines.in_process import InProcessEngine
from search_rl.rollout.engines.slot_cache import SlotCache, WritePlan

logger = logging.getLogger(__name__)

LENGTH_QUANTUM = 128
"""Cache lengths are rounded up to a multiple of this, so calls of similar lengths share one captured graph."""

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention kernels that take the engine's explicit 4-D masks."""


@dataclass
class _Call:
    """One ``generate`` call's sequences: prompts, limits, what each sampled, and the results."""

    prompts: list[list[int]]
    limits: list[int]
    params: SamplingParams
    gen: torch.Generator | None
    tokens: list[list[int]] = field(default_factory=list)
    logps: list[list[float]] = field(default_factory=list)
    results: list[Generated | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        self.tokens, self.logps, self.results = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n


def batch_bucket(n: int, most: int) -> int:
    """Slots for ``n`` sequences: the next power of two, at most ``most`` (one captured graph per bucket).

    >>> batch_bucket(5, 64), batch_bucket(100, 64), batch_bucket(48, 48)
    (8, 64, 48)
    """
    return min(1 << max(n - 1, 0).bit_length(), most)


class StaticEngine(InProcessEngine):
    """``RolloutEngine`` over a transformers causal LM with a static KV cache and, on CUDA, CUDA-graph decoding.

    Args:
        model: a causal LM whose attention goes through ``Cache.update`` and takes 4-D masks (``sdpa`` or
            ``eager`` attention: Llama, Qwen2 and most decoder-only models); its device and dtype are used as is.
        tokenizer: the model's tokenizer (decodes the generated tail to detect stop strings).
        cfg: batching and context settings, shared with the HF engine (``rollout.hf``).
        logits_processor: optional hook applied to raw logits before sampling (tests use it to script a model).
        cuda_graphs: capture the decode step on CUDA (off: the same static-cache step runs eagerly).

    Raises:
        ValueError: the model's attention implementation takes no explicit 4-D mask, or no EOS token is defined.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: HFEngineConfig | None = None,
        logits_processor: LogitsProcessor | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"StaticEngine: attention {attention!r} takes no explicit 4-D mask; load the model with "
                f"attn_implementation in {ATTENTION_IMPLEMENTATIONS}, or use rollout.engine=hf"
            )
        super().__init__(model, tokenizer, cfg)
        self.logits_processor = logits_processor
        self.cuda_graphs = cuda_graphs
        self.captures = 0
        """CUDA graphs captured so far (a counter for tests/logs)."""
        self._cache: SlotCache | None = None
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = None  # the graphs' shared memory pool (torch.cuda.graph_pool_handle)

    def sleep(self) -> None:
        """Free the KV cache and the captured graphs (the trainer's update needs the memory); the next call
        allocates and captures again."""
        self._cache, self._graphs, self._pool = None, {}, None

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generated]:
        limits = check_generate_args(prompts, params, max_new_tokens, self.max_model_len)
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.model.device).manual_seed(params.seed)
        call = _Call([list(p) for p in prompts], limits, params, gen)
        slots = batch_bucket(len(prompts), self.cfg.max_batch_size)
        need = max(len(p) + n for p, n in zip(prompts, limits, strict=True)) + 1  # + the scratch column
        length = min(-(-need // LENGTH_QUANTUM) * LENGTH_QUANTUM, self.max_model_len + 1)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                self._run(call, slots, length)
        finally:
            self.model.train(was_training)
            self.prefix.rotate()
        return [r for r in call.results if r is not None]

    def _run(self, call: _Call, slots: int, length: int) -> None:
        """Decode every sequence of ``call``, refilling slots as sequences finish."""
        cache = self._reserve(slots, length)
        queue = sorted(range(len(call.prompts)), key=lambda i: len(call.prompts[i]))  # popped longest first
        owner: list[int | None] = [None] * slots  # slot -> sequence
        tok, pos = [0] * slots, [length - 1] * slots  # next decode input per slot; idle slots write the scratch
        self._admit(call, cache, queue, owner, tok, pos, length)
        device = self.model.device
        while any(o is not None for o in owner):
            self._tok[:slots].copy_(torch.tensor(tok, device=device))
            self._pos[:slots].copy_(torch.tensor(pos, device=device))
            logits = self._decode(slots, length)  # (slots, V)
            live = [s for s in range(slots) if owner[s] is not None]
            rows = logits if len(live) == slots else logits[torch.tensor(live, device=device)]
            self._advance(call, cache, live, rows, owner, tok, pos, length)
            self._admit(call, cache, queue, owner, tok, pos, length)

    def _reserve(self, slots: int, length: int) -> SlotCache:
        """The cache, reallocated (dropping captured graphs) when it has fewer slots or columns than asked."""
        if self._cache is None or self._cache.slots < slots or self._cache.length < length:
            have = (self._cache.slots, self._cache.length) if self._cache is not None else (0, 0)
            # free the old buffers and the graphs reading them first; their pool goes too (capturing into a pool whose
            # graphs were all freed trips an assert in CUDA's caching allocator)
            self._cache, self._graphs, self._pool = None, {}, None
            new_slots, new_length = max(slots, have[0]), max(length, have[1])
            device, dtype = self.model.device, self.model.dtype
            cache = SlotCache(self.model.config, new_slots, new_length, dtype, device)
            self._cache = cache
            self._tok = torch.zeros(new_slots, dtype=torch.long, device=device)  # (slots,) decode inputs
            self._pos = torch.zeros(new_slots, dtype=torch.long, device=device)  # (slots,) their columns
            self._slot_ids = torch.arange(new_slots, device=device)
            self._columns = torch.arange(new_length, device=device)
            logger.debug("StaticEngine cache: %d slots x %d columns", new_slots, new_length)
        return self._cache

    def _admit(
        self,
        call: _Call,
        cache: SlotCache,
        queue: list[int],
        owner: list[int | None],
        tok: list[int],
        pos: list[int],
        length: int,
    ) -> None:
        """Prefill waiting sequences into free slots and sample their first tokens (repeat while some finish at
        once and sequences still wait)."""
        while queue and None in owner:
            free = [s for s, o in enumerate(owner) if o is None]
            admitted = [(free[k], queue.pop()) for k in range(min(len(free), len(queue)))]
            for slot, seq in admitted:
                owner[slot] = seq
            logits = self._prefill(call, cache, admitted, length)
            self._advance(call, cache, [s for s, _ in admitted], logits, owner, tok, pos, length)

    def _prefill(self, call: _Call, cache: SlotCache, admitted: list[tuple[int, int]], length: int) -> torch.Tensor:
        """Encode the admitted sequences' prompts into their slots; return each one's last logits (R, V).

        A prompt repeated within ``admitted`` is encoded once and its states copied to the other slots. Each
        encoded row is left-padded (padding writes the scratch column), so its last column is its last token.
        """
        first: dict[tuple[int, ...], int] = {}
        index = [first.setdefault(tuple(call.prompts[seq]), k) for k, (_, seq) in enumerate(admitted)]
        distinct = sorted(set(index))
        encoded = [admitted[k] for k in distinct]
        found = [self.prefix.lookup(call.prompts[seq]) if self.cfg.prefix_cache else (0, None) for _, seq in encoded]
        self.prefix.count(found)
        for (slot, _), (_, kv) in zip(encoded, found, strict=True):
            if kv is not None:
                cache.write_slot(slot, kv)
        suffixes = [call.prompts[seq][c:] for (_, seq), (c, _) in zip(encoded, found, strict=True)]
        device, width = self.model.device, max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._eos[0]
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long, device=device)  # (R, S)
        cols = torch.full((len(encoded), width), length - 1, dtype=torch.long, device=device)  # (R, S)
        for r, (suffix, (c, _)) in enumerate(zip(suffixes, found, strict=True)):
            input_ids[r, width - len(suffix) :] = torch.tensor(suffix, device=device)
            cols[r, width - len(suffix) :] = torch.arange(c, c + len(suffix), device=device)
        rows = torch.tensor([slot for slot, _ in encoded], device=device)
        logits = self._forward(input_ids, cols, WritePlan(rows, cols, length, dense=False), cache)  # (R_d, V)
        where = {k: r for r, k in enumerate(distinct)}
        for k, (slot, seq) in enumerate(admitted):
            if index[k] != k:
                cache.copy_slot(admitted[index[k]][0], slot, len(call.prompts[seq]))
                self.shared_prompt_tokens += len(call.prompts[seq])
        return logits[torch.tensor([where[i] for i in index], device=device)]

    def _forward(self, input_ids: torch.Tensor, cols: torch.Tensor, plan: WritePlan, cache: SlotCache) -> torch.Tensor:
        """Run the model over new tokens at cache columns ``cols`` (R, S) (= their positions); return the last
        position's logits (R, V) in float32. Query ``i`` of a row sees that row's columns ``<= cols[i]``."""
        cache.plan = plan
        visible = self._columns[: plan.length] <= cols[:, :, None]  # (R, S, L)
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=visible.device)
        mask = mask.masked_fill(~visible, torch.finfo(self.model.dtype).min)[:, None]  # (R, 1, S, L) additive
        return self._last_logits(input_ids, mask, cols, cache)

    def _decode_step(self, slots: int, length: int) -> torch.Tensor:
        """One token for every slot from ``self._tok`` at columns ``self._pos``: logits (slots, V)."""
        assert self._cache is not None
        tok, pos = self._tok[:slots, None], self._pos[:slots, None]  # (slots, 1) each
        return self._forward(tok, pos, WritePlan(self._slot_ids[:slots], pos, length, dense=True), self._cache)

    def _decode(self, slots: int, length: int) -> torch.Tensor:
        """The decode step: replayed from a CUDA graph on CUDA (captured on first use), else run eagerly."""
        if self.model.device.type != "cuda" or not self.cuda_graphs:
            return self._decode_step(slots, length)
        key = (slots, length)
        if key not in self._graphs:
            self._graphs[key] = self._capture(slots, length)
        graph, logits = self._graphs[key]
        graph.replay()
        return logits

    def _capture(self, slots: int, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the decode step as a CUDA graph. The warm-up runs compute the very step the replay computes,
        so the KV columns they write hold the same values the replay writes again."""
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._decode_step(slots, length)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._decode_step(slots, length)
        self.captures += 1
        logger.debug("StaticEngine captured the decode step for %d slots x %d columns", slots, length)
        return graph, logits

    def _advance(
        self,
        call: _Call,
        cache: SlotCache,
        live: list[int],
        logits: torch.Tensor,
        owner: list[int | None],
        tok: list[int],
        pos: list[int],
        length: int,
    ) -> None:
        """Sample one token for each slot in ``live`` from its logits row (R, V); finish or queue the next step."""
        seqs = [owner[s] for s in live]
        assert all(i is not None for i in seqs)
        ids: list[int] = [i for i in seqs if i is not None]
        params = call.params
        if self.logits_processor is not None:
            logits = self.logits_processor([call.prompts[i] for i in ids], [call.tokens[i] for i in ids], logits)
        next_tok, next_lp = sample_tokens(logits, params, call.gen)  # (R,), (R,)
        for i, t, lp in zip(ids, next_tok.tolist(), next_lp.tolist(), strict=True):
            call.tokens[i].append(t)
            call.logps[i].append(lp)
        tails = self.stop_tails(params.stop).tails([call.tokens[i] for i in ids])
        for row, (slot, i) in enumerate(zip(live, ids, strict=True)):
            reason, stop_str = finish_reason(
                call.tokens[i][-1], tails[row], params.stop, len(call.tokens[i]), call.limits[i], self._eos
            )
            fed = len(call.prompts[i]) + len(call.tokens[i]) - 1  # the newest token is not in the cache yet
            if reason is None:
                tok[slot], pos[slot] = call.tokens[i][-1], fed
                continue
            lp = tuple(call.logps[i]) if params.logprobs else None
            call.results[i] = Generated(tuple(call.tokens[i]), reason, stop_str, lp)
            if self.cfg.prefix_cache:
                self.prefix.add(call.prompts[i] + call.tokens[i][:-1], cache.read_slot(slot, fed))
            owner[slot], tok[slot], pos[slot] = None, 0, length - 1
