"""The state of one sample while the generation manager rolls it out, and the rollout metrics over a batch of them.

``SampleState`` is mutable and lives only inside ``LLMGenerationManager``; the manager freezes each into a
``Trajectory`` at the end and reports ``rollout_metrics`` beside them (turns, actions, tool calls, truncations, stop
reasons, throughput).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import get_args

from search_rl.datatypes import SearchCall, Segment, StopReason, TrajectoryStats

STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)


@dataclass
class SampleState:
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
    eos: bool = False
    """The last model turn ended with EOS (the chat template's end-of-message text was sampled)."""
    tool_calls: int = 0
    tool_errors: int = 0

    @property
    def done(self) -> bool:
        return self.stop is not None

    def count(self, **deltas: int) -> None:
        self.stats = replace(self.stats, **{k: getattr(self.stats, k) + v for k, v in deltas.items()})


def rollout_metrics(samples: Sequence[SampleState], weight_version: int, timing: dict[str, float]) -> dict[str, float]:
    """``rollout/*`` and ``timing/*`` of a finished batch: means per sample, sums of counts, the mask's share of the
    response, the stop reasons' shares, and generated tokens per second of ``timing["generate"]``."""
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
        "rollout/tool_calls": float(sum(s.tool_calls for s in samples)),
        "rollout/tool_errors": float(sum(s.tool_errors for s in samples)),
        "rollout/truncated_prompt_tokens": float(sum(st.prompt_tokens_truncated for st in stats)),
        "rollout/truncated_obs_tokens": float(sum(st.obs_tokens_truncated for st in stats)),
        "rollout/dropped_passages": float(sum(st.obs_passages_dropped for st in stats)),
        "rollout/response_budget_hits": float(sum(st.response_budget_hit for st in stats)),
        "rollout/weight_version": float(weight_version),
        "timing/generate_s": timing["generate"],
        "timing/retrieve_s": timing["retrieve"],
        "rollout/gen_tokens_per_s": model_tokens / max(timing["generate"], 1e-9),
    }
    for reason in STOP_REASONS:
        metrics[f"rollout/stop_{reason}"] = sum(s.stop == reason for s in samples) / n
    return metrics
