"""The rollout-engine seam: what the agent loop needs from any generation backend (HF transformers, vLLM)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from search_rl.datatypes import Generated, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    """Token-in/token-out generation.

    Contract (tested on every backend by ``tests/search_rl/rollout/test_engine_contract.py``):
    - ``generate`` returns one ``Generated`` per prompt, in order.
    - A sample stops at EOS, at ``max_new_tokens`` (or its per-sample override), or right after the token that
      completes one of ``params.stop``; nothing sampled after a stop is returned.
    - ``params.greedy`` gives argmax decoding; the same ``params.seed`` gives the same samples.
    """

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a sequence."""
        ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt + generation the engine accepts."""
        ...

    @property
    def weight_version(self) -> int:
        """Version of the weights currently served (bumped by ``update_weights``)."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generated]:
        """Generate a continuation for every prompt.

        Args:
            prompts: token ids per sample (no padding).
            params: sampling settings shared by the call.
            max_new_tokens: optional per-sample limits that override ``params.max_new_tokens``.
        """
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new policy weights in place (the trainer's sync step) and record ``version``."""
        ...


def check_generate_args(
    prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: Sequence[int] | None, max_model_len: int
) -> list[int]:
    """Validate a ``generate`` call and return the per-sample token limits.

    Raises:
        ValueError: for an empty prompt, a limit below 1, a length mismatch, or a prompt + limit over the context.
    """
    limits = list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * len(prompts)
    if len(limits) != len(prompts):
        raise ValueError(f"generate: {len(limits)} max_new_tokens for {len(prompts)} prompts")
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        if not prompt:
            raise ValueError(f"generate: prompt {i} is empty")
        if limit < 1:
            raise ValueError(f"generate: max_new_tokens[{i}]={limit} must be >= 1")
        if len(prompt) + limit > max_model_len:
            raise ValueError(
                f"generate: prompt {i} has {len(prompt)} tokens + {limit} new > context {max_model_len}; "
                "lower the rollout length budgets"
            )
    return limits


@runtime_checkable
class DecodeSession(Protocol):
    """Continuous batching: sequences join while others decode and leave as each finishes (``LLMGenerationManager``
    uses it so a sequence waiting for the retriever does not hold the others back).

    Contract (``tests/search_rl/rollout/test_decode_session.py``): each submitted sequence comes back from exactly
    one ``step`` with the ``Generated`` that ``generate`` would give it (same stops, limits, log-probs); with a
    ``seed``, its samples depend only on that seed and its tokens, not on which sequences shared its steps.
    """

    @property
    def pending(self) -> int:
        """Sequences submitted and not yet returned."""
        ...

    def submit(self, key: int, prompt: Sequence[int], max_new_tokens: int, seed: int | None) -> None:
        """Queue a sequence; it joins the batch at the next ``step``. A key may be submitted again once returned:
        when its new prompt extends the one it had, the states computed for that one are reused."""
        ...

    def step(self) -> list[tuple[int, Generated]]:
        """Admit queued sequences and decode one token for every running one; return those that finished."""
        ...


@runtime_checkable
class SessionEngine(Protocol):
    """An engine that can run a ``DecodeSession`` (the in-process HF engine)."""

    def open_session(self, params: SamplingParams) -> DecodeSession:
        """A session whose sequences all sample with ``params`` (its ``seed`` and ``max_new_tokens`` are per
        sequence, given to ``submit``)."""
        ...
