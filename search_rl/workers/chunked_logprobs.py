"""Token log-probs and entropies from hidden states, a chunk of tokens at a time, never all tokens' vocabulary logits.

A plain pass materialises (N, V) float32 logits (V = 151,936 for Qwen), then their log-softmax, and autograd keeps
them for the backward. ``chunked_logprobs`` projects ``chunk`` rows at a time, keeps only the (N,) results and
recomputes each chunk's logits in the backward (one more output-head matmul), so the peak is a chunk's logits.

The values are those of the plain pass: the same matmul in the compute dtype, then float32 logits divided by the
temperature, ``log_softmax``, the target's entry, and ``-sum(p log p)``. The backward applies the same derivatives
(``g * (onehot - p)`` for a log-prob, ``-g * p * (log p + H)`` for an entropy) and accumulates the weight's gradient
in float32.

``lm_head_outputs`` runs a causal LM with its output head replaced by this computation for the duration of one
call, so the hidden states never leave the model's forward: FSDP2 has the head's weight (tied or not) gathered there
and reduces its gradient as for a plain head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _ChunkedLogProbs(torch.autograd.Function):
    """``(hidden (N, H), weight (V, H), targets (N,)) -> (log-probs (N,), entropies (N,))``, chunked over N."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        chunk: int,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs = hidden.new_empty(len(hidden), dtype=torch.float32)  # (N,)
        entropy = hidden.new_empty(len(hidden), dtype=torch.float32)  # (N,)
        for start in range(0, len(hidden), chunk):
            end = start + chunk
            logp = _chunk_log_softmax(hidden[start:end], weight, temperature)  # (c, V)
            logprobs[start:end] = logp.gather(-1, targets[start:end, None]).squeeze(-1)
            entropy[start:end] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        if not entropy_grad:  # the backward then gets no entropy gradient and skips its term
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        hidden, weight, targets, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_hidden, _cast(grad_weight, weight), None, None, None, None
        for start in range(0, len(hidden), ctx.chunk):
            end = start + ctx.chunk
            h = hidden[start:end]  # (c, H)
            logp = _chunk_log_softmax(h, weight, ctx.temperature)  # (c, V)
            p = logp.exp()
            grad = torch.zeros_like(logp)  # d loss / d logits, (c, V)
            if grad_logprobs is not None:
                g = grad_logprobs[start:end, None].float()  # (c, 1)
                grad -= p * g
                grad.scatter_add_(-1, targets[start:end, None], g)
            if grad_entropy is not None:
                g = grad_entropy[start:end, None].float()  # (c, 1)
                grad -= p * (logp + entropy[start:end, None]) * g
            if ctx.temperature != 1.0:
                grad /= ctx.temperature
            grad = grad.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad @ weight
            if grad_weight is not None:
                grad_weight += (grad.T @ h).float()
        return grad_hidden, _cast(grad_weight, weight), None, None, None, None


def _chunk_log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()  # (c, V), the compute dtype's matmul as in a plain head
    if temperature != 1.0:
        logits = logits / temperature
    return logits.log_softmax(-1)


def _cast(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return grad.to(like.dtype) if grad is not None else None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` and entropies under ``softmax(hidden @ weight.T / temperature)``, ``chunk`` rows at a
    time; (N,) float32 each. The entropies are differentiable only with ``entropy_grad``.

    Args:
        hidden: (N, H) the final hidden states of the positions predicting the targets.
        weight: (V, H) the output head's weight (the embedding when tied).
        targets: (N,) token ids.
        temperature: the sampling temperature.
        chunk: rows per chunk (>= 1).
    """
    if chunk < 1:
        raise ValueError(f"chunked_logprobs: chunk must be >= 1, got {chunk}")
    logprobs, entropy = _ChunkedLogProbs.apply(hidden, weight, targets, temperature, chunk, entropy_grad)
    return logprobs, entropy


HiddenRows = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``hidden states as the head receives them -> ((N, H) rows, (N,) their targets)``."""


def output_head(model: nn.Module) -> nn.Linear:
    """The output projection of a causal LM (through adapter and FSDP wrappers).

    Raises:
        ValueError: the model has no plain bias-free linear head (the chunked path computes ``hidden @ weight.T``).
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(
            f"actor_rollout_ref.actor.logprob_chunk_tokens needs a bias-free nn.Linear output head; "
            f"{type(model).__name__} has {type(head).__name__}: set logprob_chunk_tokens=0"
        )
    return head


@contextlib.contextmanager
def lm_head_outputs(
    model: nn.Module, rows: HiddenRows, temperature: float, chunk: int, entropy_grad: bool
) -> Iterator[list[torch.Tensor]]:
    """While open, ``model``'s output head returns (N, 2) ``[log-prob, entropy]`` of the rows ``rows`` picks from
    the hidden states it receives (``chunked_logprobs``) instead of logits; the yielded list receives each call's.

    Read the values from the model's output (``out.logits``), so that the backward enters the model through its
    output as with plain logits (FSDP2 hooks the outputs), and check them against the list: a model that rescales or
    soft-caps its logits would change them, and cannot take this path."""
    head = output_head(model)
    returned: list[torch.Tensor] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        picked, targets = rows(hidden)
        logprobs, entropy = chunked_logprobs(picked, head.weight, targets, temperature, chunk, entropy_grad)
        returned.append(torch.stack([logprobs, entropy], dim=-1))  # (N, 2): the model's "logits"
        return returned[-1]

    own = head.__dict__.get("forward")  # an instance-level forward someone else set, restored after
    setattr(head, "forward", forward)  # noqa: B010 (an instance attribute shadows the class's method)
    try:
        yield returned
    finally:
        if own is None:
            del head.forward  # the class's forward again
        else:
            setattr(head, "forward", own)  # noqa: B010
