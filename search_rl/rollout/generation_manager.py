"""``LLMGenerationManager``: the multi-turn think → search → read → answer loop over a batch of prompts.

Why token-in/token-out: decoding model output to text and encoding it again is not a round trip (BPE merges differ
across segment boundaries, special tokens such as EOS vanish), so a loop that re-tokenizes its history trains on
tokens the policy never sampled. Here the response is built only by appending ids: the engine's sampled ids
(mask 1) and the encoded observations (mask 0). Text is decoded only to parse the turn's action.

One turn, for all still-active samples at once:
1. the engine generates for the active samples only, each stopping right after ``</search>``, ``</answer>`` or EOS;
2. the action is parsed from that turn's new text only (``actions.parse_action``);
3. all search queries of the turn go to the retriever in one batched call;
4. each sample gets its observation (passages, corrective feedback or retriever error), appended with mask 0.
After ``search_turns`` search turns (``rollout.search_turns``: the top-level ``max_turns``, 0 without ``do_search``)
comes one final turn in which search is off: the model must answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedTokenizerBase

from search_rl.batches import PromptBatch
from search_rl.config import RolloutConfig
from search_rl.datatypes import (
    Generated,
    Passage,
    RolloutResult,
    SamplingParams,
    SearchCall,
    Segment,
    StopReason,
    Trajectory,
    TrajectoryStats,
)
from search_rl.rollout.actions import is_search_attempt, parse_action
from search_rl.rollout.backends import RetrieverClient, RetrieverError, meter_metrics, meter_of
from search_rl.rollout.engines.base import RolloutEngine, SessionEngine
from search_rl.rollout.observations import Observation, ObservationBuilder
from search_rl.seeds import sample_seed, turn_seed
from search_rl.tags import RETRIEVER_ERROR_TEXT, STOP_STRINGS

logger = logging.getLogger(__name__)


class Retriever(Protocol):
    """What the loop needs from a search backend (``RetrieverClient`` is the HTTP one)."""

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...


@runtime_checkable
class KeyedRetriever(Protocol):
    """A retriever whose answers have recording keys (``RecordingRetriever``); search calls point to them."""

    def retrieval_keys(self, queries: Sequence[str], topk: int | None = None) -> list[str]: ...


@dataclass
class _Sample:
    """Mutable per-sample state during a rollout; frozen into a ``Trajectory`` at the end."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    calls: list[SearchCall] = field(default_factory=list)
    stats: TrajectoryStats = field(default_factory=TrajectoryStats)
    answer: str | None = None
    stop: StopReason | None = None

    @property
    def done(self) -> bool:
        return self.stop is not None

    def count(self, **deltas: int) -> None:
        self.stats = replace(self.stats, **{k: getattr(self.stats, k) + v for k, v in deltas.items()})


class LLMGenerationManager:
    """Runs search-augmented rollouts with an engine, a tokenizer and a retriever.

    Args:
        engine: any ``RolloutEngine`` (HF, static or vLLM).
        tokenizer: the policy's tokenizer (decodes turns for parsing, encodes observations).
        retriever: the search backend; may be None only when search is off.
        cfg: turns, budgets, sampling, failure policy. Budgets are checked against the engine's context here.
    """

    def __init__(
        self, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, retriever: Retriever | None, cfg: RolloutConfig
    ) -> None:
        cfg.validate(engine.max_model_len)
        if cfg.search_turns > 0 and retriever is None:
            raise ValueError(
                f"LLMGenerationManager: rollout.search_turns={cfg.search_turns} (search is on), but no retriever was "
                "given"
            )
        self.engine, self.tokenizer, self.retriever, self.cfg = engine, tokenizer, retriever, cfg
        self.obs = ObservationBuilder(tokenizer)
        if cfg.max_obs_tokens < self.obs.min_tokens + 8:
            raise ValueError(
                f"rollout.max_obs_tokens={cfg.max_obs_tokens} leaves no room for passage text next to the "
                f"{self.obs.min_tokens} tokens of the <information> tags; raise it"
            )

    def roll_out(self, prompts: PromptBatch, *, greedy: bool, seed: int | None) -> RolloutResult:
        """Rollouts of a ``PromptBatch`` without gradients (what the actor workers and the generators run), with the
        retriever's retries of this call counted in ``rollout/retriever_retries`` and its cost meter's deltas in
        ``rollout/search_calls``, ``rollout/search_cost_usd`` and ``rollout/searches_replayed``."""
        client = self.retriever
        retries_before = client.retries if isinstance(client, RetrieverClient) else 0
        meter = meter_of(client)
        before = meter.totals() if meter is not None else (0, 0.0, 0)
        with torch.no_grad():
            result = self.generate([list(p) for p in prompts.prompt_ids], greedy=greedy, seed=seed)
        if isinstance(client, RetrieverClient):
            result.metrics["rollout/retriever_retries"] = float(client.retries - retries_before)
        meter = meter_of(client)  # a recording's meter is a fresh snapshot on each read
        if meter is not None:
            result.metrics.update(meter_metrics(before, meter.totals(), len(result.trajectories)))
        return result

    def generate(
        self, prompts: Sequence[Sequence[int]], *, greedy: bool | None = None, seed: int | None = None
    ) -> RolloutResult:
        """Synchronous ``agenerate`` (starts its own event loop; inside a running loop, await ``agenerate``)."""
        return asyncio.run(self.agenerate(prompts, greedy=greedy, seed=seed))

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], *, greedy: bool | None = None, seed: int | None = None
    ) -> RolloutResult:
        """Roll out every prompt (token ids, e.g. a chat template applied) and return one trajectory each.

        Args:
            prompts: prompt token ids per sample.
            greedy: overrides ``cfg.greedy`` (validation passes True).
            seed: overrides ``cfg.seed``.

        Raises:
            ValueError: a prompt over ``max_prompt_tokens`` with ``prompt_truncation=error``.
            RetrieverError: the retriever failed for good and ``on_retriever_error=raise``.
        """
        samples = [self._start(i, p) for i, p in enumerate(prompts)]
        timing = {"generate": 0.0, "retrieve": 0.0}
        engine = self.engine
        if schedule_that_runs(self.cfg.schedule, engine) == "continuous":
            assert isinstance(engine, SessionEngine)
            await self._continuous(engine, samples, timing, greedy, seed)
        else:
            await self._in_turns(samples, timing, greedy, seed)
        return RolloutResult([self._trajectory(s) for s in samples], self._metrics(samples, timing))

    async def _in_turns(
        self, samples: list[_Sample], timing: dict[str, float], greedy: bool | None, seed: int | None
    ) -> None:
        """Lock-step turns: every active sample generates its turn, then all of the turn's queries are searched."""
        search_turns = self.cfg.search_turns
        for turn in range(search_turns + 1):
            active = [s for s in samples if not s.done]
            if not active:
                break
            start = time.perf_counter()
            gens = self._generate_turn(active, turn, greedy, seed)
            timing["generate"] += time.perf_counter() - start
            searches: list[tuple[_Sample, str]] = []
            for s, g in zip(active, gens, strict=True):
                query = self._take_turn(s, g, final=turn == search_turns)
                if query is not None:
                    searches.append((s, query))
            start = time.perf_counter()
            await self._search(searches)
            timing["retrieve"] += time.perf_counter() - start

    async def _continuous(
        self,
        engine: SessionEngine,
        samples: list[_Sample],
        timing: dict[str, float],
        greedy: bool | None,
        seed: int | None,
    ) -> None:
        """Continuous batching: a sample that stops at ``</search>`` is searched while the others keep decoding (the
        decode step runs in a worker thread, the searches on this event loop) and rejoins with its observation.
        Sample ``i``'s turn ``t`` samples from seed ``sample_seed(turn_seed(seed, t), i)``, whatever else runs."""
        search_turns = self.cfg.search_turns
        seed = self.cfg.seed if seed is None else seed
        session = engine.open_session(self._params(0, greedy, None))
        turn = [0] * len(samples)

        def submit(i: int) -> None:
            s = samples[i]
            limit = min(self.cfg.max_turn_tokens, self.cfg.max_response_tokens - len(s.ids))
            session.submit(i, s.prompt + s.ids, limit, sample_seed(turn_seed(seed, turn[i]), i))

        def next_turn(i: int) -> None:
            if not samples[i].done:
                turn[i] += 1
                submit(i)

        for i in range(len(samples)):
            submit(i)
        searching: dict[asyncio.Task[float], list[int]] = {}
        try:
            while session.pending or searching:
                if session.pending:
                    start = time.perf_counter()
                    finished = await asyncio.to_thread(session.step)
                    timing["generate"] += time.perf_counter() - start
                else:  # every remaining sample waits for the retriever
                    finished = []
                    await asyncio.wait(searching, return_when=asyncio.FIRST_COMPLETED)
                searches: list[tuple[_Sample, str]] = []
                keys: list[int] = []
                for i, g in finished:
                    query = self._take_turn(samples[i], g, final=turn[i] == search_turns)
                    if query is not None:
                        searches.append((samples[i], query))
                        keys.append(i)
                    else:
                        next_turn(i)
                if searches:
                    searching[asyncio.create_task(self._timed_search(searches))] = keys
                for task in [t for t in searching if t.done()]:
                    timing["retrieve"] += task.result()  # raises the search's error, if any
                    for i in searching.pop(task):
                        next_turn(i)
        finally:
            for task in searching:
                task.cancel()

    async def _timed_search(self, searches: list[tuple[_Sample, str]]) -> float:
        """``_search``, returning its seconds."""
        start = time.perf_counter()
        await self._search(searches)
        return time.perf_counter() - start

    def _start(self, index: int, prompt: Sequence[int]) -> _Sample:
        ids = list(prompt)
        over = len(ids) - self.cfg.max_prompt_tokens
        if over > 0 and self.cfg.prompt_truncation == "error":
            raise ValueError(
                f"prompt {index} has {len(ids)} tokens, over rollout.max_prompt_tokens={self.cfg.max_prompt_tokens}; "
                "filter long prompts, raise the budget, or set rollout.prompt_truncation=left"
            )
        sample = _Sample(prompt=ids[over:] if over > 0 else ids)
        if over > 0:
            sample.count(prompt_tokens_truncated=over)
        return sample

    def _generate_turn(
        self, active: list[_Sample], turn: int, greedy: bool | None, seed: int | None
    ) -> list[Generated]:
        cfg = self.cfg
        params = self._params(turn, greedy, cfg.seed if seed is None else seed)
        limits = [min(cfg.max_turn_tokens, cfg.max_response_tokens - len(s.ids)) for s in active]
        return self.engine.generate([s.prompt + s.ids for s in active], params, limits)

    def _params(self, turn: int, greedy: bool | None, seed: int | None) -> SamplingParams:
        """The engine's sampling settings for turn ``turn`` (a different seeded stream per turn)."""
        cfg = self.cfg
        return SamplingParams(
            max_new_tokens=cfg.max_turn_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            greedy=cfg.greedy if greedy is None else greedy,
            stop=STOP_STRINGS,
            seed=turn_seed(seed, turn),
        )

    def _take_turn(self, s: _Sample, g: Generated, *, final: bool) -> str | None:
        """Append the turn's sampled ids (mask 1), act on its action; return the query if it must be searched."""
        text = self._decode(g.token_ids)
        start = len(s.ids)
        s.ids += g.token_ids
        s.mask += [1] * len(g.token_ids)
        s.logprobs += g.logprobs if g.logprobs is not None else [0.0] * len(g.token_ids)
        s.segments.append(Segment("model", start, len(s.ids), text))
        s.count(turns=1)
        action = parse_action(text, max_query_chars=self.cfg.max_query_chars)
        if is_search_attempt(text, action):
            s.count(search_attempts=1)
        if action.kind == "answer":
            s.count(valid_actions=1)
            s.answer, s.stop = action.content, "answer"
            s.stats = replace(s.stats, finished=True)
            return None
        if final:  # search is off in the final turn: a search here is as invalid as no action
            s.count(invalid_actions=1)
            s.stop = "max_turns"
            return None
        if len(s.ids) >= self.cfg.max_response_tokens:
            self._budget_spent(s)
            return None
        if action.kind == "search":
            s.count(valid_actions=1)
            return action.content
        s.count(invalid_actions=1)
        self._insert(s, self.obs.feedback(action.feedback or "", self.cfg.max_response_tokens - len(s.ids)))
        return None

    async def _search(self, searches: list[tuple[_Sample, str]]) -> None:
        """One batched retriever call for the turn's queries, then one observation per searching sample."""
        if not searches:
            return
        assert self.retriever is not None  # guaranteed by __init__ when search turns exist
        for s, _ in searches:
            s.count(searches=1)
        try:
            results: list[list[Passage]] | None = await self.retriever.search([q for _, q in searches])
        except RetrieverError:
            if self.cfg.on_retriever_error == "raise":
                raise
            logger.warning("retriever failed for %d queries; inserting error observations", len(searches))
            results = None
        keyed = self.retriever if isinstance(self.retriever, KeyedRetriever) else None
        keys = keyed.retrieval_keys([q for _, q in searches]) if keyed is not None else [None] * len(searches)
        for i, (s, query) in enumerate(searches):
            room = min(self.cfg.max_obs_tokens, self.cfg.max_response_tokens - len(s.ids))
            if results is None:
                s.count(retriever_errors=1)
                obs = self.obs.text(RETRIEVER_ERROR_TEXT, room)
            else:
                obs = self.obs.passages(results[i], room)
            passages = obs.passages if obs else ()
            key = keys[i] if results is not None else None  # a failed search has no entry
            s.calls.append(SearchCall(query, passages, failed=results is None, retrieval_key=key))
            self._insert(s, obs)

    def _insert(self, s: _Sample, obs: Observation | None) -> None:
        """Append an observation with mask 0; end the episode when it does not fit or leaves no room to answer."""
        if obs is None:
            self._budget_spent(s)
            return
        start = len(s.ids)
        s.ids += obs.ids
        s.mask += [0] * len(obs.ids)
        s.logprobs += [0.0] * len(obs.ids)
        s.segments.append(Segment("observation", start, len(s.ids), obs.text))
        s.count(obs_tokens_truncated=obs.tokens_truncated, obs_passages_dropped=obs.passages_dropped)
        if len(s.ids) >= self.cfg.max_response_tokens:
            self._budget_spent(s)

    @staticmethod
    def _budget_spent(s: _Sample) -> None:
        s.stop = "max_response_tokens"
        s.stats = replace(s.stats, response_budget_hit=True)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _trajectory(self, s: _Sample) -> Trajectory:
        assert s.stop is not None, "every sample ends by answer, final turn or budget"
        return Trajectory(
            prompt_ids=torch.tensor(s.prompt, dtype=torch.long),
            response_ids=torch.tensor(s.ids, dtype=torch.long),
            response_mask=torch.tensor(s.mask, dtype=torch.long),
            rollout_logprobs=torch.tensor(s.logprobs, dtype=torch.float32),
            segments=tuple(s.segments),
            final_answer=s.answer,
            stop_reason=s.stop,
            stats=s.stats,
            search_calls=tuple(s.calls),
        )

    def _metrics(self, samples: list[_Sample], timing: dict[str, float]) -> dict[str, float]:
        n = max(len(samples), 1)
        stats = [s.stats for s in samples]
        model_tokens = sum(sum(s.mask) for s in samples)
        response_tokens = sum(len(s.ids) for s in samples)
        actions = sum(st.valid_actions + st.invalid_actions for st in stats)
        metrics = {
            "rollout/turns_mean": sum(st.turns for st in stats) / n,
            "rollout/searches_mean": sum(st.searches for st in stats) / n,
            "rollout/valid_action_rate": sum(st.valid_actions for st in stats) / max(actions, 1),
            "rollout/answer_rate": sum(st.finished for st in stats) / n,
            "rollout/response_tokens_mean": response_tokens / n,
            "rollout/model_tokens_mean": model_tokens / n,
            "rollout/mask_coverage": model_tokens / max(response_tokens, 1),
            "rollout/retriever_errors": float(sum(st.retriever_errors for st in stats)),
            "rollout/truncated_prompt_tokens": float(sum(st.prompt_tokens_truncated for st in stats)),
            "rollout/truncated_obs_tokens": float(sum(st.obs_tokens_truncated for st in stats)),
            "rollout/dropped_passages": float(sum(st.obs_passages_dropped for st in stats)),
            "rollout/response_budget_hits": float(sum(st.response_budget_hit for st in stats)),
            "rollout/weight_version": float(self.engine.weight_version),
            "timing/generate_s": timing["generate"],
            "timing/retrieve_s": timing["retrieve"],
            "rollout/gen_tokens_per_s": model_tokens / max(timing["generate"], 1e-9),
        }
        for reason in ("answer", "max_turns", "max_response_tokens"):
            metrics[f"rollout/stop_{reason}"] = sum(s.stop == reason for s in samples) / n
        return metrics


def _sessions_work(engine: SessionEngine) -> bool:
    """Whether ``engine`` can open sessions for its model (an engine may say so with ``supports_sessions``)."""
    return bool(getattr(engine, "supports_sessions", True))


_fell_back: set[str] = set()
"""Engine classes this process has said run ``schedule=continuous`` as turns (said once each)."""


def schedule_that_runs(schedule: str, engine: object) -> str:
    """The schedule the loop runs for ``rollout.schedule`` on ``engine``: ``continuous`` needs an engine whose decode
    sessions work for its model, else the loop runs ``turns`` and says so once per engine class (config resolution
    already refuses or warns about engines without sessions; this catches a model whose cache cannot hold them)."""
    if schedule != "continuous" or (isinstance(engine, SessionEngine) and _sessions_work(engine)):
        return schedule
    name = type(engine).__name__
    if name not in _fell_back:
        _fell_back.add(name)
        logger.warning(
            "rollout.schedule=continuous: %s cannot open decode sessions for this model; rollouts run in turns", name
        )
    return "turns"
