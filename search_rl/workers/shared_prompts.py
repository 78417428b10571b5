"""Each distinct prompt of a batch encoded once: a GRPO group's ``n`` samples share theirs.

A training batch holds every prompt ``n`` times (once per sample), and a forward pass over ``prompt + response``
would encode it ``n`` times. ``SharedPrompts`` runs the model once over the distinct prompts (all but their last
token) and keeps the key/value states; the response passes then read them as a KV cache, feeding only the last
prompt token and the response. Causal attention makes the result the same as the full pass (up to float rounding).

With gradients (the actor update), the states handed to the response passes are detached leaves: each micro-batch's
backward accumulates their gradient, and ``backward()`` at the end of the mini-batch sends the sum through the
prompt pass once. The prompt pass's logits join that backward with a zero gradient so that every sharded layer sees
a gradient at its output, as FSDP2 expects before it gathers the layer's weights.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from search_rl.batches import TrainBatch
from search_rl.models.loading import CACHE_KWARG


def prompt_keys(batch: TrainBatch) -> list[tuple[int, ...]]:
    """Each row's real prompt token ids (padding removed): equal keys mean the same prompt."""
    p = batch.prompt_length
    ids, mask = batch.input_ids[:, :p], batch.attention_mask[:, :p].bool()
    return [tuple(row[m].tolist()) for row, m in zip(ids, mask, strict=True)]


class SharedPrompts:
    """The KV states of a batch's distinct prompts (each without its last token), computed once.

    Args:
        model: the causal LM the response passes will use (same weights, same adapters state).
        batch: the rows whose prompts are encoded; later micro-batches must come from it.
        grad: keep the graph and hand out leaves (``backward()`` must then be called once after the micro-batches).
    """

    def __init__(self, model: nn.Module, batch: TrainBatch, *, grad: bool) -> None:
        keys = prompt_keys(batch)
        self._index: dict[tuple[int, ...], int] = {}
        first_row: list[int] = []  # a row of each distinct prompt, whose positions it uses
        for row, k in enumerate(keys):
            if k not in self._index:
                self._index[k] = len(self._index)
                first_row.append(row)
        distinct = list(self._index)
        short = [row for row, k in zip(first_row, distinct, strict=True) if len(k) < 2]
        if short:
            raise ValueError(f"SharedPrompts needs prompts of at least 2 tokens; rows {short} have fewer")
        device = next(model.parameters()).device
        p, width = batch.prompt_length, max(len(k) - 1 for k in distinct)
        ids = torch.zeros((len(distinct), width), dtype=torch.long)  # (U, m) left-padded, last token left out
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        positions = torch.zeros((len(distinct), width), dtype=torch.long)
        for u, (k, row) in enumerate(zip(distinct, first_row, strict=True)):
            ids[u, width - len(k) + 1 :] = torch.tensor(k[:-1])
            mask[u, width - len(k) + 1 :] = 1
            positions[u, width - len(k) + 1 :] = batch.position_ids[row, p - len(k) : p - 1]
        self.mask = mask.to(device)  # (U, m)
        self.tokens = int(mask.sum())
        """Prompt tokens encoded (the distinct prompts' prefixes)."""
        self.saved_tokens = sum(len(k) - 1 for k in keys) - self.tokens
        """Prompt tokens the batch's response passes will not encode again."""
        cache = DynamicCache()
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            out = model(
                input_ids=ids.to(device),
                attention_mask=self.mask,
                position_ids=positions.to(device),
                **{CACHE_KWARG: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        self._states: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in cache.layers:
            k_state, v_state = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(k_state, torch.Tensor) or not isinstance(v_state, torch.Tensor):
                raise TypeError(f"SharedPrompts needs key/value cache layers, got {type(layer).__name__}")
            self._states.append((k_state, v_state))
        self._grad = grad and out.logits.requires_grad
        self._logits = out.logits if self._grad else None
        if self._grad:
            self._leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in self._states]
        else:
            self._leaves = self._states

    @property
    def distinct(self) -> int:
        """Distinct prompts in the batch."""
        return len(self._index)

    def cache_for(self, micro: TrainBatch) -> tuple[DynamicCache, torch.Tensor]:
        """(a KV cache holding each row's prompt prefix, its (B, m) attention mask) for rows of the batch."""
        missing = [i for i, k in enumerate(prompt_keys(micro)) if k not in self._index]
        if missing:
            raise KeyError(f"SharedPrompts: rows {missing} have a prompt that is not in the batch it encoded")
        rows = torch.tensor([self._index[k] for k in prompt_keys(micro)], device=self.mask.device)
        cache = DynamicCache()
        for layer, (k, v) in enumerate(self._leaves):
            cache.update(k[rows], v[rows], layer)
        return cache, self.mask[rows]

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the shared states through the prompt pass (once)."""
        if not self._grad:
            return
        assert self._logits is not None
        outputs: list[torch.Tensor] = [self._logits]
        grads: list[torch.Tensor] = [torch.zeros_like(self._logits)]
        for (k, v), (lk, lv) in zip(self._states, self._leaves, strict=True):
            for state, leaf in ((k, lk), (v, lv)):
                outputs.append(state)
                grads.append(leaf.grad if leaf.grad is not None else torch.zeros_like(state))
        torch.autograd.backward(outputs, grads)
        self._grad, self._logits, self._states, self._leaves = False, None, [], []
