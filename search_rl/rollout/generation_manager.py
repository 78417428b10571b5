"""``LLMGenerationManager``: the multi-turn think → search → read → answer loop over a batch of prompts.

Why token-in/token-out: decoding model output to text and encoding it again is not a round trip (BPE merges differ
across segment boundaries, special tokens such as EOS vanish), so a loop that re-tokenizes its history trains on
tokens the policy never sampled. Here the response is built only by appending ids: the engine's sampled ids
(mask 1) and the encoded observations (mask 0). Text is decoded only to parse the turn's action.

One turn, for all still-active samples at once:
1. the engine generates for the active samples only, each stopping right after ``</search>``, ``</answer>`` or EOS;
2. the action is parsed from that turn's new text only, in the rollout's action format (``tools/``: Search-R1 tags by
   default, or the model's chat-template tool calls);
3. the turn's tool calls go to their tools through the tool seam (``tools.base.Tool``), a tool's calls together
   (all search queries of the turn in one batched retriever call);
4. each sample gets its observation (passages, a tool's answer, corrective feedback or an error), appended with
   mask 0, whatever tool produced it.
After ``search_turns`` tool turns (``rollout.search_turns``: the top-level ``max_turns``, 0 without ``do_search``)
comes one final turn in which tools are off: the model must answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedTokenizerBase

from search_rl.batches import PromptBatch
from search_rl.config import RolloutConfig
from search_rl.datatypes import (
    Generated,
    RolloutResult,
    SamplingParams,
    SearchCall,
    Segment,
    Trajectory,
)
from search_rl.rollout.backends import RetrieverClient, meter_metrics, meter_of
from search_rl.rollout.engines.base import RolloutEngine, SessionEngine
from search_rl.rollout.engines.choice import schedule_that_runs
from search_rl.rollout.observations import Observation
from search_rl.rollout.sample_state import SampleState, rollout_metrics
from search_rl.rollout.tools import (
    ActionFormat,
    BatchTool,
    KeyedRetriever,
    Retriever,
    Tool,
    ToolCall,
    ToolResult,
    build_format,
    build_tools,
    describe_call,
    join_observations,
)
from search_rl.seeds import sample_seed, turn_seed

logger = logging.getLogger(__name__)

__all__ = ["KeyedRetriever", "LLMGenerationManager", "Retriever"]


class LLMGenerationManager:
    """Runs tool-augmented rollouts (search first of all) with an engine, a tokenizer and a retriever.

    Args:
        engine: any ``RolloutEngine`` (HF, static or vLLM).
        tokenizer: the policy's tokenizer (decodes turns for parsing, encodes observations).
        retriever: the search backend (the ``search`` tool); may be None only when search is off.
        cfg: turns, budgets, sampling, failure policy, action format and the tools it declares
            (``rollout.tools``). Budgets are checked against the engine's context here.
        tools: further tools, built by the caller (after those of ``cfg.tools``).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        retriever: Retriever | None,
        cfg: RolloutConfig,
        tools: Sequence[Tool] = (),
    ) -> None:
        cfg.validate(engine.max_model_len)
        if cfg.search_turns > 0 and retriever is None:
            raise ValueError(
                f"LLMGenerationManager: rollout.search_turns={cfg.search_turns} (search is on), but no retriever was "
                "given"
            )
        self.engine, self.tokenizer, self.retriever, self.cfg = engine, tokenizer, retriever, cfg
        self.tools: dict[str, Tool] = {t.name: t for t in build_tools(cfg, retriever, tools)}
        self.format: ActionFormat = build_format(cfg, tokenizer, list(self.tools.values()))
        if cfg.max_obs_tokens < self.format.min_obs_tokens + 8:
            raise ValueError(
                f"rollout.max_obs_tokens={cfg.max_obs_tokens} leaves no room for passage text next to the "
                f"{self.format.min_obs_tokens} tokens that frame an observation; raise it"
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
        return RolloutResult(
            [self._trajectory(s) for s in samples], rollout_metrics(samples, self.engine.weight_version, timing)
        )

    async def _in_turns(
        self, samples: list[SampleState], timing: dict[str, float], greedy: bool | None, seed: int | None
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
            pending: list[tuple[SampleState, tuple[ToolCall, ...]]] = []
            for s, g in zip(active, gens, strict=True):
                calls = self._take_turn(s, g, final=turn == search_turns)
                if calls is not None:
                    pending.append((s, calls))
            start = time.perf_counter()
            await self._call_tools(pending)
            timing["retrieve"] += time.perf_counter() - start

    async def _continuous(
        self,
        engine: SessionEngine,
        samples: list[SampleState],
        timing: dict[str, float],
        greedy: bool | None,
        seed: int | None,
    ) -> None:
        """Continuous batching: a sample that stops at a tool call (``</search>``) is answered while the others keep
        decoding (the decode step runs in a worker thread, the tools on this event loop) and rejoins with its
        observation.
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
                pending: list[tuple[SampleState, tuple[ToolCall, ...]]] = []
                keys: list[int] = []
                for i, g in finished:
                    calls = self._take_turn(samples[i], g, final=turn[i] == search_turns)
                    if calls is not None:
                        pending.append((samples[i], calls))
                        keys.append(i)
                    else:
                        next_turn(i)
                if pending:
                    searching[asyncio.create_task(self._timed_calls(pending))] = keys
                for task in [t for t in searching if t.done()]:
                    timing["retrieve"] += task.result()  # raises the search's error, if any
                    for i in searching.pop(task):
                        next_turn(i)
        finally:
            for task in searching:
                task.cancel()

    async def _timed_calls(self, pending: list[tuple[SampleState, tuple[ToolCall, ...]]]) -> float:
        """``_call_tools``, returning its seconds."""
        start = time.perf_counter()
        await self._call_tools(pending)
        return time.perf_counter() - start

    def _start(self, index: int, prompt: Sequence[int]) -> SampleState:
        ids = list(prompt)
        over = len(ids) - self.cfg.max_prompt_tokens
        if over > 0 and self.cfg.prompt_truncation == "error":
            raise ValueError(
                f"prompt {index} has {len(ids)} tokens, over rollout.max_prompt_tokens={self.cfg.max_prompt_tokens}; "
                "filter long prompts, raise the budget, or set rollout.prompt_truncation=left"
            )
        sample = SampleState(prompt=ids[over:] if over > 0 else ids)
        if over > 0:
            sample.count(prompt_tokens_truncated=over)
        return sample

    def _generate_turn(
        self, active: list[SampleState], turn: int, greedy: bool | None, seed: int | None
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
            stop=self.format.stop,
            seed=turn_seed(seed, turn),
        )

    def _take_turn(self, s: SampleState, g: Generated, *, final: bool) -> tuple[ToolCall, ...] | None:
        """Append the turn's sampled ids (mask 1), act on its action; return the tool calls it made, if any."""
        text = self._decode(g.token_ids)
        start = len(s.ids)
        s.ids += g.token_ids
        s.mask += [1] * len(g.token_ids)
        s.logprobs += g.logprobs if g.logprobs is not None else [0.0] * len(g.token_ids)
        s.segments.append(Segment("model", start, len(s.ids), text))
        s.eos = g.finish_reason == "eos"
        s.count(turns=1)
        action = self.format.parse(text)
        if action.search_attempt:
            s.count(search_attempts=1)
        if action.kind == "answer":
            s.count(**({"valid_actions": 1} if action.answer is not None else {"invalid_actions": 1}))
            s.answer, s.stop = action.answer, "answer"
            s.stats = replace(s.stats, finished=action.answer is not None)
            return None
        if final:  # tools are off in the final turn: a call here is as invalid as no action
            s.count(invalid_actions=1)
            s.stop = "max_turns"
            return None
        if len(s.ids) >= self.cfg.max_response_tokens:
            self._budget_spent(s)
            return None
        if action.kind == "call":
            s.count(**({"valid_actions": 1} if any(c.error is None for c in action.calls) else {"invalid_actions": 1}))
            return action.calls
        s.count(invalid_actions=1)
        self._insert(s, self.format.feedback(action.feedback or "", self.cfg.max_response_tokens - len(s.ids)))
        return None

    async def _call_tools(self, pending: list[tuple[SampleState, tuple[ToolCall, ...]]]) -> None:
        """Answer every call of the turn (each tool's calls together), then give each sample its observation."""
        if not pending:
            return
        for s, cs in pending:
            s.count(searches=sum(c.name == "search" and c.error is None for c in cs))
        results = iter(await self._run([c for _, cs in pending for c in cs]))
        for s, cs in pending:
            self._observe(s, cs, [next(results) for _ in cs])

    async def _run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """The result of each call, in order: an error result for a malformed call, else its tool's answer."""
        out: list[ToolResult | None] = [None if c.error is None else ToolResult(c.error, failed=True) for c in calls]
        by_tool: dict[str, list[int]] = {}
        for i, c in enumerate(calls):
            if c.error is None:
                by_tool.setdefault(c.name, []).append(i)

        async def answer(name: str, where: list[int]) -> None:
            tool, arguments = self.tools[name], [calls[i].arguments for i in where]
            if isinstance(tool, BatchTool):
                results = await tool.call_batch(arguments)
            else:
                results = list(await asyncio.gather(*(tool.call(a) for a in arguments)))
            for i, r in zip(where, results, strict=True):
                out[i] = r

        await asyncio.gather(*(answer(name, where) for name, where in by_tool.items()))
        return [r for r in out if r is not None]

    def _observe(self, s: SampleState, calls: tuple[ToolCall, ...], results: list[ToolResult]) -> None:
        """Record the sample's calls and insert the observation of their results (mask 0)."""
        room = min(self.cfg.max_obs_tokens, self.cfg.max_response_tokens - len(s.ids))
        shown = self.format.results(results, [c.name for c in calls], room, eos_sampled=s.eos)
        s.tool_calls += len(calls)
        s.tool_errors += sum(r.failed for r in results)
        for i, (c, r) in enumerate(zip(calls, results, strict=True)):
            if r.unavailable:
                s.count(retriever_errors=1)
            if c.error is None:
                passages = shown[i].passages if shown is not None else ()
                s.calls.append(SearchCall(describe_call(c), passages, r.failed, r.retrieval_key, tool=c.name))
        self._insert(s, None if shown is None else join_observations(shown))

    def _insert(self, s: SampleState, obs: Observation | None) -> None:
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
    def _budget_spent(s: SampleState) -> None:
        s.stop = "max_response_tokens"
        s.stats = replace(s.stats, response_budget_hit=True)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _trajectory(self, s: SampleState) -> Trajectory:
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
