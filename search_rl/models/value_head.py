"""The critic: a causal LM's backbone (without its LM head) plus a scalar value head on every position.

Built from the same source as the policy (``load_model``), so PPO's critic starts from the policy's weights, as in
Search-R1/verl. The head starts at zero, so the first values are 0 (a neutral baseline for rewards in [0, 1]) and the
backbone learns from the second update on. The critic worker checkpoints the whole module's state dict as
``critic/model.safetensors``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from search_rl.models.loading import load_model


class ValueModel(nn.Module):
    """``values = head(backbone(input_ids).last_hidden_state)``: (B, L) scalars.

    Args:
        backbone: the base model of a causal LM (``causal_lm.model``), returning ``last_hidden_state``.
        hidden_size: its hidden width.
    """

    def __init__(self, backbone: PreTrainedModel, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> PretrainedConfig:
        """The backbone's HF config."""
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        keep_last: int | None = None,
    ) -> torch.Tensor:
        """Values at every position (B, L), or at the last ``keep_last`` positions (B, keep_last)."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, L, H)
        if keep_last is not None:
            hidden = hidden[:, -keep_last:]
        # a fresh tensor, not a view: FSDP2 hooks the root module's output for its backward
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).clone()  # (B, L)


def build_value_model(source: str, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> ValueModel:
    """A ``ValueModel`` on CPU whose backbone is ``source``'s causal LM without its head."""
    causal = load_model(source, dtype=dtype, seed=seed)
    backbone = causal.model
    model = ValueModel(backbone, int(causal.config.hidden_size))
    return model.to(dtype=dtype)
