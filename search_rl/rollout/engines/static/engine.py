"""Static-cache generation: the HF engine's contract over a forward written for decoding (``lean_decoder``), with
sampling and stops on the device and, on CUDA, each decode step captured once per shape and replayed.

A call's sequences live in the slots of one pre-allocated KV cache (``slot_cache.SlotCache``); slots ``0..live-1``
are the running ones. A decode step runs the lean forward for those rows, samples (``sample_tokens`` with one
counter-based uniform per row: ``decoding.counter_uniforms``), writes the token and its log-prob into per-slot
buffers and marks EOS and length stops, all on the device (``decode_state.DecodeState``; the call's host side is
``decode_state.CallState``). The host reads back every ``readback_steps`` steps (8 on CUDA, 1 on CPU, where a
step past a stop costs real compute and a readback costs nothing): it checks stop strings on the new tokens, drops
what came after a stop, stores finished sequences' KV states for the next call (prefix reuse), moves the last
running slots into the freed ones (so the running rows stay a dense prefix) and prefills waiting sequences into the
free slots. A GRPO group's repeated prompt is encoded once and copied, and the prefix every prompt of a call shares
(the instruction template) once per call.

With ``cuda_graphs`` on CUDA the decode step is captured as a graph per (rows bucket, width bucket, sampling
settings), kept across calls and training steps (``sleep`` keeps them unless told to free the memory), and checked
against the eager step before it is trusted (``step_graphs``); weights are updated in place, so the graphs stay valid.
Graphs and ``compile`` are opt-in through ``rollout.static`` until this engine passes ``bench/gpu_round.py`` on a GPU
(``choice.STATIC_PASSED_GPU_ROUND``). Whatever goes wrong in them falls back, once each, to what has run: an
exception while capturing or replaying, or a replay that differs from its eager step, drops the graphs; an exception
from the compiled forward swaps in the uncompiled one. Each fallback logs one warning naming its stage and the
error, is counted in ``fallbacks``, and redoes the call.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.rollout.engines.decoding import LogitsProcessor, fill_holes, stream_key
from search_rl.rollout.engines.in_process import InProcessEngine
from search_rl.rollout.engines.prefix_cache import MIN_COMMON_PREFIX_SAVING, common_prefix_length
from search_rl.rollout.engines.static.decode_state import CallState, DecodeState
from search_rl.rollout.engines.static.lean_decoder import LeanDecoder
from search_rl.rollout.engines.static.slot_cache import SlotCache
from search_rl.rollout.engines.static.step_graphs import GraphFactory, GraphFallback, StepGraphs, replay_bound

logger = logging.getLogger(__name__)

LENGTH_QUANTUM = 128
"""Cache lengths and (with graphs) attention widths are rounded up to a multiple of this, so calls of similar
lengths share one cache and one captured graph."""

PREFILL_TOKENS = 16384
"""Padded tokens one prefill forward encodes at most (rows are split over several forwards beyond it): bounds the
activations of a large admission (256 rows x 400 new tokens of a 3B model would hold GBs of MLP activations)."""

GPU_READBACK_STEPS = 8
"""Decode steps between two host readbacks on CUDA (each readback waits for the GPU)."""


class CompileError(RuntimeError):
    """The compiled forward raised (the cause); the engine falls back to the uncompiled one."""


def batch_bucket(n: int, most: int) -> int:
    """Slots for ``n`` sequences: the next power of two, at most ``most`` (one captured graph per bucket).

    >>> batch_bucket(5, 64), batch_bucket(100, 64), batch_bucket(48, 48)
    (8, 64, 48)
    """
    return min(1 << max(n - 1, 0).bit_length(), most)


def _round_up(n: int, quantum: int) -> int:
    return -(-n // quantum) * quantum


class StaticEngine(InProcessEngine):
    """``RolloutEngine`` over a Llama/Qwen2 causal LM: a static KV cache, the lean forward, sampling and stops on the
    device and, on CUDA, captured decode steps.

    Args:
        model: a Llama or Qwen2 causal LM (``lean_decoder.check_supported``); its device and dtype are used as is,
            and its q/k/v and gate/up parameters become views of fused tensors.
        tokenizer: the model's tokenizer (decodes generated tails to detect stop strings).
        cfg: batching and context settings, shared with the HF engine (``rollout.hf``).
        logits_processor: optional hook applied to raw logits before sampling (tests use it to script a model);
            with one, the host reads back every step and no graph is captured.
        cuda_graphs: capture the decode step on CUDA or through ``graph_factory`` (off: the same step runs eagerly);
            ``rollout.static.cuda_graphs`` is off by default (``factory.build_static_engine``).
        compiled: ``torch.compile`` the forward's elementwise parts (``LeanDecoder``; meant for CUDA, off by default).
        graph_factory: makes the captured-step objects (tests give a stand-in, which also captures on CPU).
        readback_steps: decode steps between host readbacks (None: 8 on CUDA, 1 elsewhere).
        free_on_sleep: ``sleep`` frees the cache and the graphs (off: they stay, captured once for the whole run).

    Raises:
        ValueError: the model is not one the lean forward models, or no EOS token is defined.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: HFEngineConfig | None = None,
        logits_processor: LogitsProcessor | None = None,
        cuda_graphs: bool = True,
        compiled: bool = False,
        graph_factory: GraphFactory | None = None,
        readback_steps: int | None = None,
        free_on_sleep: bool = False,
    ) -> None:
        super().__init__(model, tokenizer, cfg)
        self.decoder = LeanDecoder(model, self.max_model_len + 1, compiled)  # + the scratch column's position
        self.logits_processor = logits_processor
        self.device = model.device
        on_cuda = self.device.type == "cuda"
        self.use_graphs = cuda_graphs and (on_cuda or graph_factory is not None) and logits_processor is None
        self.graphs = StepGraphs(graph_factory, replay_bound(model.dtype), self.device)
        self.cuda_graphs, self.compiled = self.use_graphs, compiled
        """What the engine was built with (the evaluation fingerprint pins them); a fallback turns ``use_graphs`` or
        the decoder's compile off, not these."""
        self.readback_steps = readback_steps or (GPU_READBACK_STEPS if on_cuda else 1)
        if self.readback_steps < 1:
            raise ValueError(f"StaticEngine: readback_steps must be >= 1, got {self.readback_steps}")
        self.free_on_sleep = free_on_sleep
        self.fallbacks: Counter[str] = Counter()
        """Calls redone without graphs or compile, by stage: ``capture``, ``replay`` (either raised), ``mismatch`` (a
        replay differed from its eager step), ``compile`` (the compiled forward raised)."""
        self._eos_ids = torch.tensor(self.eos_token_ids, device=self.device)
        self._cache: SlotCache | None = None
        self._state: DecodeState | None = None
        self._rows = torch.arange(0, device=self.device)

    @property
    def captures(self) -> int:
        """Decode steps captured so far."""
        return self.graphs.captures

    @property
    def graph_fallbacks(self) -> int:
        """Calls redone eagerly because a captured step failed (raised, or differed from the eager step)."""
        return sum(n for stage, n in self.fallbacks.items() if stage != "compile")

    def sleep(self) -> None:
        """Before a training update: free the KV cache and its graphs if ``free_on_sleep`` (else keep them: a
        captured graph costs its capture once per run, not once per step)."""
        if self.free_on_sleep:
            self._drop_cache()

    def _drop_cache(self) -> None:
        self.graphs.drop()
        self._cache, self._state = None, None

    # --- a call ----------------------------------------------------------------------------------------------

    def _generate(self, prompts: list[list[int]], limits: list[int], params: SamplingParams) -> list[Generated]:
        if not self.decoder.intact():  # something moved the parameters (a .to(), a reassigned .data)
            self.decoder.rebind()
            self._drop_cache()
            self.prefix.clear()  # states computed with the tensors it held before
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()))
        streams = [stream_key(seed, i) for i in range(len(prompts))]
        while True:  # each fallback turns graphs or compile off for good: at most two redos
            try:
                return self._run(CallState(prompts, limits, params, streams))
            except (GraphFallback, CompileError) as e:
                if not self._fall_back(e):
                    raise

    def _fall_back(self, error: GraphFallback | CompileError) -> bool:
        """Turn off what raised ``error`` (the graphs, or the compiled forward), warn once naming it and count it;
        False when it is already off (the caller re-raises)."""
        if isinstance(error, GraphFallback) and self.use_graphs:
            stage, now = error.stage, "decoding eagerly"
            self.use_graphs = False
        elif isinstance(error, CompileError) and self.decoder.compiled:
            stage, now = "compile", "running the uncompiled forward"
            self.decoder = LeanDecoder(self.model, self.max_model_len + 1, compiled=False)
        else:
            return False
        logger.warning(
            "StaticEngine on %s, %s fallback: %s; %s from now on (the call is redone)", self.device, stage, error, now
        )
        self.fallbacks[stage] += 1
        self._drop_cache()
        self.prefix.clear()  # states written by what failed are not trusted
        return True

    def _run(self, call: CallState) -> list[Generated]:
        """Decode every sequence of ``call``, refilling slots as sequences finish."""
        n = len(call.prompts)
        cap = batch_bucket(n, self.cfg.max_batch_size) if self.use_graphs else min(n, self.cfg.max_batch_size)
        need = max(len(p) + k for p, k in zip(call.prompts, call.limits, strict=True)) + 1  # + the scratch column
        length = min(_round_up(need, LENGTH_QUANTUM), self.max_model_len + 1)
        self._reserve(cap, length)
        queue = sorted(range(n), key=lambda i: len(call.prompts[i]))  # popped longest first
        assert self._cache is not None
        owner: list[int | None] = [None] * self._cache.slots  # slot -> sequence; slots 0..live-1 are running
        live = 0
        eager_readback = self.readback_steps == 1 or self.logits_processor is not None
        while queue or live:
            live = self._admit(call, queue, owner, live, cap)
            if eager_readback:  # the hook needs the first tokens; a row that ended on its first token leaves now
                live = self._collect(call, owner, live)
            self._decode_block(call, owner, live)
            live = self._collect(call, owner, live)
        return [r for r in call.results if r is not None]

    def _reserve(self, slots: int, length: int) -> None:
        """The cache and decode state, reallocated (dropping captured graphs) when smaller than asked."""
        cache = self._cache
        if cache is not None and cache.slots >= slots and cache.length >= length:
            return
        have = (cache.slots, cache.length) if cache is not None else (0, 0)
        self._drop_cache()  # free the old buffers and the graphs reading them first
        slots, length = max(slots, have[0]), max(length, have[1])
        self._cache = SlotCache(self.model.config, slots, length, self.model.dtype, self.device)
        self._state = DecodeState(slots, length, self.device)
        self._rows = torch.arange(slots, device=self.device)
        logger.debug("StaticEngine cache on %s: %d slots x %d columns", self.device, slots, length)

    # --- prefill ---------------------------------------------------------------------------------------------

    def _admit(self, call: CallState, queue: list[int], owner: list[int | None], live: int, cap: int) -> int:
        """Prefill waiting sequences into the free slots ``live..cap-1`` and sample their first tokens; returns the
        new number of running slots."""
        k = min(cap - live, len(queue))
        if k == 0:
            return live
        admitted = [(live + j, queue.pop()) for j in range(k)]
        for slot, seq in admitted:
            owner[slot] = seq
        logits = self._prefill(call, admitted)  # (k, V)
        st = self._state
        assert st is not None
        rows = torch.tensor([s for s, _ in admitted], device=self.device)
        st.pos[rows] = torch.tensor([len(call.prompts[i]) - 1 for _, i in admitted], device=self.device)
        st.limit[rows] = torch.tensor([call.limits[i] for _, i in admitted], device=self.device)
        st.stream[rows] = torch.tensor([call.streams[i] for _, i in admitted], device=self.device)
        st.n_gen[rows], st.done[rows] = 0, False
        if self.logits_processor is not None:
            logits = self.logits_processor([call.prompts[i] for _, i in admitted], [[] for _ in admitted], logits)
        self._sample_advance(logits, rows, call.params)
        return live + k

    def _prefill(self, call: CallState, admitted: list[tuple[int, int]]) -> torch.Tensor:
        """Encode the admitted sequences' prompts into their slots; return each one's last logits (k, V).

        A prompt repeated within ``admitted`` is encoded once and its states copied; reused states (the prefix store,
        the call's common prefix) are put in the slots first, and only the rest is encoded, left-padded (padding
        writes the scratch column).
        """
        cache = self._cache
        assert cache is not None
        first: dict[tuple[int, ...], int] = {}
        index = [first.setdefault(tuple(call.prompts[seq]), k) for k, (_, seq) in enumerate(admitted)]
        distinct = sorted(set(index))
        encoded = [admitted[k] for k in distinct]
        prompts = [call.prompts[seq] for _, seq in encoded]
        reused = self._place_reused(prompts, [slot for slot, _ in encoded]) if self.cfg.prefix_cache else None
        starts = reused or [0] * len(encoded)
        suffixes = [p[c:] for p, c in zip(prompts, starts, strict=True)]
        logits = self._encode([slot for slot, _ in encoded], suffixes, starts)
        for k, (slot, seq) in enumerate(admitted):
            if index[k] != k:
                cache.copy_slot(admitted[index[k]][0], slot, len(call.prompts[seq]))
                self.shared_prompt_tokens += len(call.prompts[seq])
        where = {k: r for r, k in enumerate(distinct)}
        return logits[torch.tensor([where[i] for i in index], device=self.device)]

    def _place_reused(self, prompts: list[list[int]], slots: list[int]) -> list[int]:
        """Write each prompt's reusable states into its slot: the longest stored prefix (the previous call's
        sequences), or the call's common prefix where that is longer, encoded once and copied. Returns the tokens
        reused per prompt."""
        cache = self._cache
        assert cache is not None
        found = [self.prefix.lookup(p) for p in prompts]
        self.prefix.count(found)
        common = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1) if len(prompts) > 1 else 0
        takers = [k for k, (c, _) in enumerate(found) if c < common]
        if len(takers) < 2 or (len(takers) - 1) * common < MIN_COMMON_PREFIX_SAVING:
            takers = []
        for k, (_, kv) in enumerate(found):
            if kv is not None and k not in takers:
                cache.write_slot(slots[k], kv)
        if takers:
            self._encode([slots[takers[0]]], [prompts[takers[0]][:common]], [0])
            for k in takers[1:]:
                cache.copy_slot(slots[takers[0]], slots[k], common)
            self.prefix.stats.common_tokens += common * len(takers)
            self.prefix.stats.reused_tokens += common * len(takers)
        return [common if k in takers else c for k, (c, _) in enumerate(found)]

    def _encode(self, slots: list[int], suffixes: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Run ``suffixes`` (each continuing its slot from column ``starts[r]``) through the model, left-padded, in
        forwards of at most ``PREFILL_TOKENS`` padded tokens (rows of similar length together); return each row's last
        logits (R, V)."""
        order = sorted(range(len(slots)), key=lambda r: len(suffixes[r]))
        parts: list[torch.Tensor] = []
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end + 1 - start) * len(suffixes[order[end]]) <= PREFILL_TOKENS:
                end += 1
            rows = order[start:end]
            parts.append(
                self._encode_rows([slots[r] for r in rows], [suffixes[r] for r in rows], [starts[r] for r in rows])
            )
            start = end
        logits = torch.cat(parts)  # rows in ``order``
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))
        return logits[back.to(logits.device)]

    def _encode_rows(self, slots: list[int], suffixes: list[list[int]], starts: list[int]) -> torch.Tensor:
        """One left-padded prefill forward of ``suffixes`` into ``slots`` (padding writes the scratch column)."""
        cache = self._cache
        assert cache is not None
        width = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        input_ids = torch.full((len(slots), width), pad, dtype=torch.long)  # (R, S), built on the host
        positions = torch.zeros((len(slots), width), dtype=torch.long)  # (R, S)
        cols = torch.full((len(slots), width), cache.scratch, dtype=torch.long)  # (R, S)
        for r, (suffix, c) in enumerate(zip(suffixes, starts, strict=True)):
            input_ids[r, width - len(suffix) :] = torch.tensor(suffix)
            positions[r, width - len(suffix) :] = torch.arange(c, c + len(suffix))
            cols[r, width - len(suffix) :] = positions[r, width - len(suffix) :]
        span = max(c + len(s) for c, s in zip(starts, suffixes, strict=True))
        device = self.device
        rows = torch.tensor(slots, device=device)
        return self._forward(input_ids.to(device), positions.to(device), cache, rows, cols.to(device), span)

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        rows: torch.Tensor | None,
        cols: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        """``decoder.forward``; with compile on, whatever it raises is the compiled kernels' (``CompileError``)."""
        if not self.decoder.compiled:
            return self.decoder.forward(input_ids, positions, cache, rows, cols, width)
        try:
            return self.decoder.forward(input_ids, positions, cache, rows, cols, width)
        except Exception as e:
            raise CompileError(f"the compiled forward raised {type(e).__name__}: {e}") from e

    # --- decode ----------------------------------------------------------------------------------------------

    def _decode_block(self, call: CallState, owner: list[int | None], live: int) -> None:
        """Up to ``readback_steps`` decode steps of the running slots, nothing read back."""
        if live == 0:
            return
        cache = self._cache
        assert cache is not None
        steps = self.readback_steps if self.logits_processor is None else 1
        ahead = [
            len(call.prompts[i]) + min(len(call.tokens[i]) + steps, call.limits[i])
            for i in (owner[s] for s in range(live))
            if i is not None
        ]
        width = max(ahead)  # every column a running row writes in this block, plus one
        rows = live
        if self.use_graphs:
            rows = batch_bucket(live, cache.slots)
            width = min(_round_up(width, LENGTH_QUANTUM), cache.length)
        for _ in range(steps):
            self._step(call, owner, rows, width)

    def _step(self, call: CallState, owner: list[int | None], rows: int, width: int) -> None:
        """One token for slots ``0..rows-1`` (idle and finished ones compute and write nothing that is read)."""
        st, cache, params = self._state, self._cache, call.params
        assert st is not None and cache is not None
        index = self._rows[:rows]
        tok, pos = st.tok[:rows, None], st.pos[:rows, None]  # (rows, 1) each

        def step() -> torch.Tensor:
            logits = self._forward(tok, pos, cache, None, pos, width)  # (rows, V)
            self._sample_advance(logits, index, params)
            return logits

        if self.logits_processor is not None:
            logits = self._forward(tok, pos, cache, None, pos, width)
            ids = [owner[s] for s in range(rows)]
            logits = self.logits_processor(
                [call.prompts[i] if i is not None else [] for i in ids],
                [call.tokens[i] if i is not None else [] for i in ids],
                logits,
            )
            self._sample_advance(logits, index, params)
        elif self.use_graphs:
            key = (rows, width, params.greedy, params.temperature, params.top_p, params.top_k)
            self.graphs.run(key, step, st.snapshot, lambda: st.tok[:rows], lambda: ~st.done[:rows])
        else:
            step()

    def _sample_advance(self, logits: torch.Tensor, rows: torch.Tensor, params: SamplingParams) -> None:
        """Sample and record one token for each slot in ``rows`` (R,) from its logits (R, V), on the device."""
        assert self._state is not None
        self._state.advance(logits, rows, params, self._eos_ids)

    # --- readback --------------------------------------------------------------------------------------------

    def _collect(self, call: CallState, owner: list[int | None], live: int) -> int:
        """Read the running slots' new tokens, finish the sequences that ended (EOS, length, or a stop string
        found now), keep their states for the next call, and compact the running slots; returns how many run."""
        st, cache = self._state, self._cache
        assert st is not None and cache is not None
        if live == 0:
            return 0
        ids = [owner[s] for s in range(live)]
        assert all(i is not None for i in ids)
        seqs = [i for i in ids if i is not None]
        have = call.take(st, seqs)
        screen = self.stop_tails(call.params.stop)
        finished = []
        for s, i in enumerate(seqs):
            if call.finish(i, have[s], screen, self.eos_token_ids):
                finished.append(s)
                if self.cfg.prefix_cache:
                    fed = call.prompts[i] + call.tokens[i][:-1]
                    self.prefix.add(fed, cache.read_slot(s, len(fed)))
        if not finished:
            return live
        keep = [s for s in range(live) if s not in set(finished)]
        for dst, src in enumerate(fill_holes(keep, live)):
            moved = owner[src]
            if src != dst and moved is not None:
                cache.copy_slot(src, dst, len(call.prompts[moved]) + len(call.tokens[moved]) - 1)
                st.move(src, dst)
                owner[dst] = moved
        for s in range(len(keep), live):
            owner[s] = None
            st.free(s)
        return len(keep)
