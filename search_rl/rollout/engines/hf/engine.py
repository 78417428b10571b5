"""HF transformers generation backend: batched, left-padded, KV-cached decoding with per-sample stop strings.

A hand-written decode loop rather than ``model.generate`` because the rollout needs, per sample: the exact sampled
ids, their log-probs, the stop string that ended it, and nothing after that stop. Finished rows are dropped from the
batch and the KV cache (``DynamicCache.batch_select_indices``), so a sample that stops early costs nothing more. The
cache's layers grow in place (``growing_cache``) rather than by ``torch.cat`` every step, and a finished row's place
is taken by a row from the end of the batch (only that row's states are copied).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.models.loading import CACHE_KWARG
from search_rl.rollout.engines.decoding import LogitsProcessor, fill_holes, finish_reason, row_states, sample_tokens
from search_rl.rollout.engines.hf.growing_cache import growing_cache
from search_rl.rollout.engines.hf.packed_decode import TRANSFORMERS_PACKS_GQA, packed_decode
from search_rl.rollout.engines.hf.session import HFSession
from search_rl.rollout.engines.in_process import InProcessEngine
from search_rl.rollout.engines.prefix_cache import (
    KV,
    MIN_COMMON_PREFIX_SAVING,
    balance_reuse,
    common_prefix_length,
)


class HFEngine(InProcessEngine):
    """``RolloutEngine`` over a transformers causal LM (CPU default; works on CUDA too).

    Args:
        model: a causal LM; its device and dtype are used as they are.
        tokenizer: the model's tokenizer (decodes the generated tail to detect stop strings).
        cfg: batching and context settings.
        logits_processor: optional hook applied to raw logits before sampling (tests use it to script a model).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: HFEngineConfig | None = None,
        logits_processor: LogitsProcessor | None = None,
    ) -> None:
        super().__init__(model, tokenizer, cfg)
        self.logits_processor = logits_processor
        self.packed_decode = not TRANSFORMERS_PACKS_GQA
        """Decode steps attend per KV head (``packed_decode.packed_decode``); transformers does so itself from 5.23."""

    @property
    def supports_sessions(self) -> bool:
        """Whether ``open_session`` works for this model: every cache layer is a plain ``DynamicLayer`` (sliding
        windows and other layer kinds cannot be padded and concatenated)."""
        layers = DynamicCache(config=self.model.config).layers
        return all(type(layer) is DynamicLayer for layer in layers)

    def open_session(self, params: SamplingParams) -> HFSession:
        """A continuous-batching ``DecodeSession`` (``session.HFSession``).

        Raises:
            ValueError: the model's cache is not made of plain ``DynamicLayer`` s (``supports_sessions``).
        """
        if not self.supports_sessions:
            raise ValueError("HFEngine.open_session: this model's KV cache has non-dynamic layers (sliding window?)")
        return HFSession(self, params)

    def _generate(self, prompts: list[list[int]], limits: list[int], params: SamplingParams) -> list[Generated]:
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.model.device).manual_seed(params.seed)
        # Longest first: similar lengths share a micro-batch, so less padding is computed.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        out: list[Generated | None] = [None] * len(prompts)
        bs = self.cfg.max_batch_size
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            results = self._generate_batch([prompts[i] for i in idx], [limits[i] for i in idx], params, gen)
            for i, r in zip(idx, results, strict=True):
                out[i] = r
        return [r for r in out if r is not None]

    def _generate_batch(
        self, prompts: list[list[int]], limits: list[int], params: SamplingParams, gen: torch.Generator | None
    ) -> list[Generated]:
        device = self.model.device
        n = len(prompts)
        logits, attention, last_pos, cache = self.prefill(prompts)

        active = list(range(n))  # rows of the current batch tensors -> sample index
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        results: list[Generated | None] = [None] * n
        stops = params.stop
        screen = self.stop_tails(stops)
        noise_rows: torch.Tensor | None = None  # row -> its sample's draw, once rows are reordered
        while True:
            if self.logits_processor is not None:
                logits = self.logits_processor([prompts[i] for i in active], [tokens[i] for i in active], logits)
            next_tok, next_lp = sample_tokens(logits, params, gen, noise_rows=noise_rows)  # (R,), (R,)
            tok_list, lp_list = next_tok.tolist(), next_lp.tolist()
            for row, i in enumerate(active):
                tokens[i].append(tok_list[row])
                logps[i].append(lp_list[row])
            tails = screen.tails([tokens[i] for i in active])
            keep: list[int] = []
            for row, i in enumerate(active):
                reason, stop_str = finish_reason(
                    tokens[i][-1], tails[row], stops, len(tokens[i]), limits[i], self.eos_token_ids
                )
                if reason is None:
                    keep.append(row)
                    continue
                lp = tuple(logps[i]) if params.logprobs else None
                results[i] = Generated(tuple(tokens[i]), reason, stop_str, lp)
                if self.cfg.prefix_cache:
                    self._store_prefix(prompts[i] + tokens[i][:-1], cache, attention, row)
            if not keep:
                break
            if len(keep) < len(active):
                order = fill_holes(keep, len(active))  # only rows from the end move into the leavers' places
                sel = torch.tensor(order, device=device)
                cache.batch_select_indices(sel)
                attention, last_pos, next_tok = attention[sel], last_pos[sel], next_tok[sel]
                active = [active[r] for r in order]
                # draws go to the samples in index order, whatever order their rows are now in
                ranks = {i: k for k, i in enumerate(sorted(active))}
                in_order = all(ranks[i] == row for row, i in enumerate(active))
                noise_rows = None if in_order else torch.tensor([ranks[i] for i in active], device=device)
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)  # (R, L+1)
            last_pos = last_pos + 1
            logits = self.forward(next_tok[:, None], attention, last_pos[:, None], cache)
        return [r for r in results if r is not None]

    def prefill(
        self, prompts: list[list[int]], found: list[tuple[int, KV | None]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Encode each distinct prompt once (a GRPO group's ``n`` samples share theirs) and give every row its copy;
        return (logits (R, V), attention, last positions, cache). ``found``: reusable states per prompt (default:
        looked up in the prefix store)."""
        rows_of: dict[tuple[int, ...], int] = {}
        index = [rows_of.setdefault(tuple(p), len(rows_of)) for p in prompts]
        if len(rows_of) == len(prompts):
            return self._encode(prompts, found)
        distinct = [list(p) for p in rows_of]
        first = {k: i for i, k in reversed(list(enumerate(index)))}
        distinct_found = [found[first[k]] for k in range(len(distinct))] if found is not None else None
        self.shared_prompt_tokens += sum(len(p) for p in prompts) - sum(len(p) for p in distinct)
        logits, attention, last_pos, cache = self._encode(distinct, distinct_found)
        sel = torch.tensor(index, device=logits.device)
        cache.batch_select_indices(sel)
        return logits[sel], attention[sel], last_pos[sel], cache

    def _encode(
        self, prompts: list[list[int]], found: list[tuple[int, KV | None]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Encode the prompts, reusing stored prefixes (``found``: (tokens reused, their states) per prompt, default
        looked up in the prefix store); return (logits (R, V), attention, last positions, cache).

        Row layout, columns = cache positions: ``[pad][reused prefix (c_i)][pad][new suffix (s_i)]``, padding
        masked out of attention and positions counted over real tokens only, so every row sees exactly its prompt.
        Reuse is first balanced (``balance_reuse``): every row that reuses encodes the same number of new tokens, so
        the middle padding is empty and the batch spans its longest prompt.
        """
        device = self.model.device
        if found is None:
            found = [self.prefix.lookup(p) if self.cfg.prefix_cache else (0, None) for p in prompts]
        common = [False] * len(prompts)
        if self.cfg.prefix_cache:
            found, common = self._share_common_prefix(prompts, found)
        found = balance_reuse([len(p) for p in prompts], found)
        self.prefix.count(found)
        self.prefix.stats.common_tokens += sum(c for (c, _), shared in zip(found, common, strict=True) if shared)
        reused = [c for c, _ in found]
        suffixes = [p[c:] for p, c in zip(prompts, reused, strict=True)]
        n, c_max, s_max = len(prompts), max(reused), max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        input_ids = torch.full((n, s_max), pad, dtype=torch.long, device=device)  # (R, S)
        positions = torch.zeros((n, s_max), dtype=torch.long, device=device)  # (R, S)
        attention = torch.zeros((n, c_max + s_max), dtype=torch.long, device=device)  # (R, C+S)
        for i, (c, suffix) in enumerate(zip(reused, suffixes, strict=True)):
            input_ids[i, s_max - len(suffix) :] = torch.tensor(suffix, device=device)
            positions[i, s_max - len(suffix) :] = torch.arange(c, c + len(suffix), device=device)
            attention[i, c_max - c : c_max] = 1
            attention[i, c_max + s_max - len(suffix) :] = 1
        cache = growing_cache(self.model.config)
        if c_max > 0:
            self._fill_cache(cache, found, c_max)
        logits = self.forward(input_ids, attention, positions, cache)
        return logits, attention, positions[:, -1], cache

    def _share_common_prefix(
        self, prompts: list[list[int]], found: list[tuple[int, KV | None]]
    ) -> tuple[list[tuple[int, KV | None]], list[bool]]:
        """Encode the prefix every prompt of the call starts with (the instruction template of a rollout batch) once,
        as a one-row forward, and give it to each row that has no longer stored prefix. Returns the new ``found``
        and, per row, whether it took the common prefix."""
        n = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        common = [c < n for c, _ in found]
        if sum(common) < 2 or (sum(common) - 1) * n < MIN_COMMON_PREFIX_SAVING:
            return found, [False] * len(found)
        _, attention, _, cache = self._encode([prompts[0][:n]], [(0, None)])
        kv = row_states(cache, attention, 0, n)
        return [(n, kv) if shared else entry for entry, shared in zip(found, common, strict=True)], common

    @staticmethod
    def _fill_cache(cache: DynamicCache, found: list[tuple[int, KV | None]], c_max: int) -> None:
        """Put each row's reused KV states right-aligned in a (R, kv_heads, C, head_dim) block per layer."""
        ref = next(kv for _, kv in found if kv is not None)
        for layer, (ref_k, ref_v) in enumerate(ref):
            keys = ref_k.new_zeros((len(found), ref_k.shape[0], c_max, ref_k.shape[2]))
            values = ref_v.new_zeros((len(found), ref_v.shape[0], c_max, ref_v.shape[2]))
            for i, (c, kv) in enumerate(found):
                if kv is not None:
                    keys[i, :, c_max - c :] = kv[layer][0]
                    values[i, :, c_max - c :] = kv[layer][1]
            cache.update(keys, values, layer)

    def _store_prefix(self, fed: list[int], cache: DynamicCache, attention: torch.Tensor, row: int) -> None:
        """Keep a finished row's KV states (its real, non-padding columns) for the next call."""
        self.prefix.add(fed, row_states(cache, attention, row, len(fed)))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Run the model over new tokens (R, S) with a KV cache; return the last position's logits (R, V) in
        float32. Only that position's logits are computed (a prefill's full (R, S, V) would be GBs with a 49k
        vocabulary); one-token steps go through ``packed_decode`` where it applies."""
        with packed_decode(self.model, self.packed_decode and input_ids.shape[1] == 1):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{CACHE_KWARG: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[:, -1, :].float()
