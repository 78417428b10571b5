"""The data contract between engines, agent loop, rewards and trainer: frozen dataclasses, no string-keyed dicts.

Shapes use ``B`` = trajectories, ``T`` = response tokens, ``P`` = prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

FinishReason = Literal["stop", "eos", "length"]
SegmentKind = Literal["model", "observation"]
StopReason = Literal["answer", "max_turns", "max_response_tokens"]


@dataclass(frozen=True)
class SamplingParams:
    """How one engine call samples. ``greedy=True`` overrides temperature/top-p/top-k (argmax decoding)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(
                f"SamplingParams.temperature must be > 0 when sampling, got {self.temperature}; use greedy=True instead"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError(f"SamplingParams.stop has an empty stop string: {self.stop!r}")


@dataclass(frozen=True)
class Generated:
    """One sample's output of one engine call, token-exact.

    ``token_ids`` end with the token that completed a stop string or with EOS (both kept: they were sampled);
    nothing sampled after a stop is ever included. ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under
    the distribution it was sampled from (logits / temperature, before top-p/top-k; temperature 1 when greedy).
    """

    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stop_str: str | None = None
    logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"Generated: {len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")
        if (self.finish_reason == "stop") != (self.stop_str is not None):
            raise ValueError(f"Generated: stop_str={self.stop_str!r} does not fit finish_reason={self.finish_reason!r}")


@dataclass(frozen=True)
class Passage:
    """One retrieved document. ``title`` has the corpus's surrounding quotes removed."""

    id: str
    title: str
    text: str
    score: float | None = None


@dataclass(frozen=True)
class Segment:
    """A contiguous run ``response_ids[start:end]`` that the model generated or that the loop inserted."""

    kind: SegmentKind
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class TrajectoryStats:
    """Counters of one trajectory; every truncation, invalid action and retriever failure is counted here."""

    turns: int = 0
    searches: int = 0
    valid_actions: int = 0
    invalid_actions: int = 0
    finished: bool = False
    retriever_errors: int = 0
    prompt_tokens_truncated: int = 0
    obs_tokens_truncated: int = 0
    obs_passages_dropped: int = 0
    response_budget_hit: bool = False
    search_attempts: int = 0
    """Model turns that tried to search: not a valid answer, and the turn's text holds the opening ``<search>`` tag
    (well formed or not). ``searches`` of them were well formed and sent to the retriever."""


@dataclass(frozen=True)
class SearchCall:
    """One tool call the loop made (a query sent to the retriever unless ``tool`` says otherwise), and the passages
    the model was shown for it.

    ``passages`` are as inserted into the response: each text cut to the tokens that fit the observation budget,
    passages dropped for room left out; empty when the retriever failed (``failed``), returned nothing, or the
    observation did not fit at all.
    """

    query: str
    passages: tuple[Passage, ...] = ()
    failed: bool = False
    retrieval_key: str | None = None
    """The entry of the retrieval recording that answered it (``search_rl.rollout.backends.recording``); None when not
    recorded."""
    tool: str = "search"
    """The tool called (``search``, ``open`` or a tool of ``rollout.tools``); ``query`` is then its one string
    argument, or its arguments as JSON."""


@dataclass(frozen=True)
class Trajectory:
    """One multi-turn rollout of one prompt, token-exact.

    The response interleaves what the model sampled with what the loop inserted; ``response_mask`` marks which
    is which, and every loss/KL/entropy/value term must use it::

        prompt (P)  | response (T) .............................................................
        <|im_start| | <think>..</think><search> q </search> | <information>Doc 1..</information> | <answer> a </answer>
        mask:       | 1  1  1  1  1  1  1  1  1  1  1  1  1 | 0  0  0  0  0  0  0  0  0  0  0  0 | 1  1  1  1  1  1  1
                      model-generated                         inserted observation                 model-generated

    In a ``TrainBatch``, padding (left of the prompt, right of the response) has mask 0 and attention 0.

    ``response_mask[t] == 1`` iff ``response_ids[t]`` was sampled from the policy in this rollout, in which case
    ``rollout_logprobs[t]`` is its sampling log-prob (0.0 where the mask is 0).

    Fields:
        prompt_ids: (P,) int64 — the prompt exactly as given to the engine (after any counted truncation).
        response_ids: (T,) int64 — model tokens exactly as sampled, plus inserted observation tokens.
        response_mask: (T,) int64 — 1 = model-generated, 0 = inserted.
        rollout_logprobs: (T,) float32, or None when the engine gives no log-probs.
        segments: the model/observation runs of the response, with their decoded text (for parsing and reward).
        final_answer: the answer text of the episode's ``<answer>`` action, or None.
        stop_reason: why the episode ended.
        stats: counters (turns, searches, valid/invalid actions, truncations, retriever errors).
        search_calls: each query sent to the retriever, in order, with the passages shown for it (what search
            diagnostics read: duplicate queries, whether a gold answer was retrieved).
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor | None
    segments: tuple[Segment, ...]
    final_answer: str | None
    stop_reason: StopReason
    stats: TrajectoryStats
    search_calls: tuple[SearchCall, ...] = ()

    def __post_init__(self) -> None:
        t = self.response_ids.shape[0]
        if self.response_mask.shape != (t,):
            raise ValueError(f"Trajectory: response_mask shape {tuple(self.response_mask.shape)} != ({t},)")
        if self.rollout_logprobs is not None and self.rollout_logprobs.shape != (t,):
            raise ValueError(f"Trajectory: rollout_logprobs shape {tuple(self.rollout_logprobs.shape)} != ({t},)")

    @property
    def num_searches(self) -> int:
        """Searches actually sent to the retriever."""
        return self.stats.searches

    @property
    def model_texts(self) -> tuple[str, ...]:
        """Decoded text of each model-generated segment, in order (what rewards and format checks read)."""
        return tuple(s.text for s in self.segments if s.kind == "model")

    @property
    def attention_mask(self) -> torch.Tensor:
        """(P+T,) ones: an unpadded trajectory attends to every token."""
        return torch.ones(self.prompt_ids.shape[0] + self.response_ids.shape[0], dtype=torch.long)

    @property
    def position_ids(self) -> torch.Tensor:
        """(P+T,) 0, 1, 2, ...: positions of prompt and response tokens."""
        return torch.arange(self.prompt_ids.shape[0] + self.response_ids.shape[0], dtype=torch.long)


@dataclass(frozen=True)
class GroundTruth:
    """What a rollout is scored against: gold answers and the row's ``data_source`` (selects the scoring fn)."""

    target: tuple[str, ...]
    data_source: str = "default"


@dataclass(frozen=True)
class RewardResult:
    """A scalar reward plus named components for logging (``{"em": 1.0, "format": 0.0}``)."""

    score: float
    components: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutResult:
    """What ``LLMGenerationManager.generate`` returns: one trajectory per prompt, in order, plus batch metrics.

    ``metrics`` keys are namespaced: ``rollout/*`` (means and rates over the batch) and ``timing/*`` (seconds).
    """

    trajectories: list[Trajectory]
    metrics: dict[str, float]
