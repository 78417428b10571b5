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
from search_rl.models.cache_arg import CACHE_KWARG
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens under ``model`` at ``temperature`` (the sampling distribution), and
    optionally the per-token entropies; (B, T) each, 0 past each response. Gradients flow when enabled; the
    entropy's only with ``entropy_grad`` (its (B, T, V) intermediates are not kept for a metric).

    ``only``: (B, T) mask of the response tokens whose values are needed (the loss mask); the others are 0 and their
    logits are never computed. The vocabulary projection and softmax of the inserted ``<information>`` tokens, most
    of a search response, are skipped; the transformer still reads them.

    ``shared``: the prompts' KV states, computed once for the batch ``batch`` belongs to (``SharedPrompts``); the
    pass then feeds only the last prompt token and the response.
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
    if only is None:
        out = model(**inputs, logits_to_keep=t + 1)
        logits = out.logits[:, :-1].float()  # (B, t, V)
        wanted = None
    else:
        wanted = only[:, :t].to(device).bool()  # (B, t)
        logits = _wanted_logits(model, inputs, wanted, t)  # (N, V)
        targets = targets[wanted]  # (N,)
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, t) or (N,)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)  # (B, t) or (N,)
    if wanted is not None:
        logprobs = _scatter(logprobs, wanted)
        entropy = _scatter(entropy, wanted) if entropy is not None else None
    width = batch.response_ids.shape[1]
    return _pad_to(logprobs, width), (_pad_to(entropy, width) if entropy is not None else None)


def _wanted_logits(model: nn.Module, inputs: dict[str, object], wanted: torch.Tensor, t: int) -> torch.Tensor:
    """Float logits of the positions predicting the ``wanted`` (B, t) response tokens, (N, V) in row-major order."""
    if not LOGITS_MASK_SUPPORTED:
        return model(**inputs, logits_to_keep=t + 1).logits[:, :-1][wanted].float()  # (B, t, V) -> (N, V)
    length = inputs["input_ids"].shape[1]  # type: ignore[attr-defined]
    keep = torch.zeros((len(wanted), length), dtype=torch.bool, device=wanted.device)  # (B, L)
    keep[:, length - t - 1 : length - 1] = wanted  # the position before a token predicts it
    return model(**inputs, logits_to_keep=keep).logits.float()


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
