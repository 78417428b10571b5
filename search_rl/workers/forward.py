"""Forward passes over ``TrainBatch`` micro-batches: response log-probs, entropies and values.

A batch is padded to the widest prompt (left) and to ``max_response_tokens`` (right); a micro-batch is first cut
to the columns some row uses, so padding costs nothing. The model sees ``input_ids[:, first:P+t]`` and only the
logits of the last ``t + 1`` positions are computed (``logits_to_keep``): the position before response token ``k``
predicts it. Outputs are padded back to the batch's ``T`` with zeros.

Computing only the loss tokens' logits needs a (B, L) boolean ``logits_to_keep``, which transformers accepts from
the release that added ``modeling_utils.slice_logits_to_keep`` (5.24 has it, 5.20 not); older 5.x releases (5.19,
what vLLM 0.32 pins) index the hidden states with it as a slice and fail. There the last ``t + 1`` positions are
computed and the loss tokens selected afterwards: the same values, more vocabulary rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import modeling_utils

from search_rl.algorithms import entropy_from_logits
from search_rl.batches import TrainBatch
from search_rl.models.loading import CACHE_KWARG
from search_rl.workers.chunked_logprobs import lm_head_outputs
from search_rl.workers.shared_prompts import SharedPrompts

LOGITS_MASK_SUPPORTED: bool = hasattr(modeling_utils, "slice_logits_to_keep")
"""Whether the installed transformers accepts a (B, L) boolean ``logits_to_keep`` (see the module docstring)."""


def used_columns(batch: TrainBatch) -> tuple[int, int]:
    """(first input column any row attends to, longest real response ``t``) of a left/right-padded batch."""
    attended = batch.attention_mask.any(dim=0).nonzero()  # (n, 1)
    first = int(attended[0, 0]) if len(attended) else 0
    t = int(batch.response_attention_mask.sum(dim=-1).max())
    return min(first, batch.prompt_length - 1), max(t, 1)


def _trimmed_inputs(batch: TrainBatch) -> tuple[dict[str, torch.Tensor], int]:
    first, t = used_columns(batch)
    end = batch.prompt_length + t
    inputs = {
        "input_ids": batch.input_ids[:, first:end],
        "attention_mask": batch.attention_mask[:, first:end],
        "position_ids": batch.position_ids[:, first:end],
    }
    return inputs, t


def _inputs_after_shared_prompt(
    batch: TrainBatch, shared: SharedPrompts, device: torch.device
) -> tuple[dict[str, object], int]:
    """The last prompt token and the response, reading each row's prompt prefix from ``shared`` as a KV cache."""
    _, t = used_columns(batch)
    start, end = batch.prompt_length - 1, batch.prompt_length + t
    cache, prefix_mask = shared.cache_for(batch)
    inputs: dict[str, object] = {
        "input_ids": batch.input_ids[:, start:end].to(device),
        "attention_mask": torch.cat([prefix_mask, batch.attention_mask[:, start:end].to(device)], dim=1),
        "position_ids": batch.position_ids[:, start:end].to(device),
        CACHE_KWARG: cache,
        "use_cache": True,
    }
    return inputs, t


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(x, (0, width - x.shape[-1]))


def response_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    temperature: float,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    only: torch.Tensor | None = None,
    shared: SharedPrompts | None = None,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens under ``model`` at ``temperature`` (the sampling distribution), and
    optionally the per-token entropies; (B, T) each, 0 past each response. Gradients flow when enabled; the
    entropy's only with ``entropy_grad`` (its (B, T, V) intermediates are not kept for a metric).

    ``only``: (B, T) mask of the response tokens whose values are needed (the loss mask); the others are 0 and their
    logits are never computed. The vocabulary projection and softmax of the inserted ``<information>`` tokens, most
    of a search response, are skipped; the transformer still reads them.

    ``shared``: the prompts' KV states, computed once for the batch ``batch`` belongs to (``SharedPrompts``); the
    pass then feeds only the last prompt token and the response.

    ``chunk_tokens``: > 0 computes the values from the hidden states that many tokens at a time, never holding every
    token's vocabulary logits (``chunked_logprobs``); 0 projects all tokens at once.
    """
    device = next(model.parameters()).device
    inputs: dict[str, object]
    if shared is None:
        trimmed, t = _trimmed_inputs(batch)
        inputs = {k: v.to(device) for k, v in trimmed.items()}
        inputs["use_cache"] = False
    else:
        inputs, t = _inputs_after_shared_prompt(batch, shared, device)
    targets = batch.response_ids[:, :t].to(device)  # (B, t)
    wanted = only[:, :t].to(device).bool() if only is not None else None  # (B, t)
    if chunk_tokens > 0:
        entropy_grad = entropy_grad and torch.is_grad_enabled()
        logprobs, entropies = _chunked_values(
            model, inputs, targets, wanted, t, temperature, chunk_tokens, entropy_grad
        )
        if not entropy_grad:
            entropies = entropies.detach()
    else:
        logprobs, entropies = _plain_values(model, inputs, targets, wanted, t, temperature, with_entropy, entropy_grad)
    entropy = entropies if with_entropy else None
    if wanted is not None:
        logprobs = _scatter(logprobs, wanted)
        entropy = _scatter(entropy, wanted) if entropy is not None else None
    width = batch.response_ids.shape[1]
    return _pad_to(logprobs, width), (_pad_to(entropy, width) if entropy is not None else None)


def _plain_values(
    model: nn.Module,
    inputs: dict[str, object],
    targets: torch.Tensor,
    wanted: torch.Tensor | None,
    t: int,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropies), (B, t) or (N,) for the ``wanted`` tokens, from the float logits of all of them; the
    entropies are zeros unless ``with_entropy``."""
    if wanted is None:
        logits = model(**inputs, logits_to_keep=t + 1).logits[:, :-1].float()  # (B, t, V)
    else:
        logits = _wanted_logits(model, inputs, wanted, t)  # (N, V)
        targets = targets[wanted]  # (N,)
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, t) or (N,)
    if not with_entropy:
        return logprobs, torch.zeros_like(logprobs)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return logprobs, entropy_from_logits(logits)


def _chunked_values(
    model: nn.Module,
    inputs: dict[str, object],
    targets: torch.Tensor,
    wanted: torch.Tensor | None,
    t: int,
    temperature: float,
    chunk: int,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_plain_values`` computed inside the model's output head, ``chunk`` tokens at a time (``lm_head_outputs``)."""
    keep: int | torch.Tensor = t + 1
    if wanted is not None and LOGITS_MASK_SUPPORTED:
        keep = _keep_mask(inputs, wanted, t)  # (B, L)

    def rows(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(keep, torch.Tensor):  # the head already received the wanted rows, (N, H)
            return hidden, targets[wanted]
        hidden = hidden[:, :-1]  # (B, t, H)
        if wanted is None:
            return hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        return hidden[wanted], targets[wanted]

    with lm_head_outputs(model, rows, temperature, chunk, entropy_grad) as returned:
        out = model(**inputs, logits_to_keep=keep).logits  # (N, 2)
    if len(returned) != 1 or not torch.equal(out, returned[0]):
        raise ValueError(
            f"actor_rollout_ref.actor.logprob_chunk_tokens: {type(model).__name__} changed its output head's values "
            f"(a logit scale or soft-cap); set logprob_chunk_tokens=0"
        )
    logprobs, entropy = out[:, 0], out[:, 1]  # (N,) each
    if wanted is None:
        logprobs, entropy = logprobs.view(targets.shape), entropy.view(targets.shape)  # (B, t)
    return logprobs, entropy


def _wanted_logits(model: nn.Module, inputs: dict[str, object], wanted: torch.Tensor, t: int) -> torch.Tensor:
    """Float logits of the positions predicting the ``wanted`` (B, t) response tokens, (N, V) in row-major order."""
    if not LOGITS_MASK_SUPPORTED:
        return model(**inputs, logits_to_keep=t + 1).logits[:, :-1][wanted].float()  # (B, t, V) -> (N, V)
    return model(**inputs, logits_to_keep=_keep_mask(inputs, wanted, t)).logits.float()


def _keep_mask(inputs: dict[str, object], wanted: torch.Tensor, t: int) -> torch.Tensor:
    """The (B, L) boolean ``logits_to_keep`` of the positions predicting the ``wanted`` (B, t) response tokens, the
    response being the last ``t`` of the ``L`` input columns."""
    length = inputs["input_ids"].shape[1]  # type: ignore[attr-defined]
    keep = torch.zeros((len(wanted), length), dtype=torch.bool, device=wanted.device)  # (B, L)
    keep[:, length - t - 1 : length - 1] = wanted  # the position before a token predicts it
    return keep


def _scatter(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) values of ``mask``'s true cells, in row-major order, placed into a zero (B, t) tensor (differentiable)."""
    return values.new_zeros(mask.shape).masked_scatter(mask, values)


def response_values(model: nn.Module, batch: TrainBatch) -> torch.Tensor:
    """Critic values at the position before each response token (the state the token was chosen in); (B, T)."""
    inputs, t = _trimmed_inputs(batch)
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    values = model(**inputs, keep_last=t + 1)[:, :-1].float()  # (B, t)
    return _pad_to(values, batch.response_ids.shape[1])


def model_token_count(batch: TrainBatch) -> int:
    """Tokens a forward pass over ``batch`` processes after trimming (prompt + response columns in use)."""
    inputs, _ = _trimmed_inputs(batch)
    return int(inputs["attention_mask"].sum())
