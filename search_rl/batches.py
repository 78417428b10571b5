"""The batch containers moved between the driver and the workers: prompts going out, training batches coming back.

Both are frozen dataclasses with named, typed fields (no string-keyed dicts). A field is one of three kinds:

- a tensor whose first dimension is the batch (``B``);
- a per-sample tuple (strings, ints, token-id tuples): the non-tensor fields;
- ``meta``: one ``BatchMeta`` for the whole batch (step, weight version), carried along unchanged.

``BatchOps`` gives both the verbs the trainer needs, generically over those kinds: ``select`` (indices or a boolean
mask), ``split`` (near-equal shards, for ``WorkerGroup.map_shards``), ``split_by_size`` (mini/micro-batches),
``concat`` and ``repeat_interleave`` (``n`` samples per prompt, adjacent, so GRPO groups stay contiguous); a later
phase fills the fields it computes (``old_logprobs``, ``values``) with ``replace``. Optional tensor fields are
``None`` until the phase that computes them; ``__post_init__`` checks that every set field has the same batch
length (verl's ``check_consistency``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import torch

from search_rl.datatypes import Trajectory

Index = torch.Tensor | Sequence[int]


@dataclass(frozen=True)
class BatchMeta:
    """Batch-wide values carried with a batch (not indexed by sample)."""

    step: int = 0
    """Training step the batch belongs to (0 = validation before training)."""
    weight_version: int = 0
    """Version of the policy weights that generated the batch."""


def _as_index(index: Index, size: int) -> torch.Tensor:
    idx = torch.as_tensor(index)
    if idx.dtype == torch.bool:
        if idx.shape != (size,):
            raise ValueError(f"boolean index of shape {tuple(idx.shape)} for a batch of {size}")
        idx = idx.nonzero().flatten()
    return idx.long()


def _take(value: Any, idx: torch.Tensor) -> Any:
    if value is None or isinstance(value, BatchMeta):
        return value
    if isinstance(value, torch.Tensor):
        return value[idx]
    return tuple(value[i] for i in idx.tolist())


def _cat(values: list[Any], name: str) -> Any:
    first = values[0]
    if isinstance(first, BatchMeta):
        return first
    if any((v is None) != (first is None) for v in values):
        raise ValueError(f"concat: field {name!r} is set in some batches and None in others")
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        widths = {tuple(v.shape[1:]) for v in values}
        if len(widths) > 1:
            raise ValueError(f"concat: field {name!r} has different widths {sorted(widths)}; pad them first")
        return torch.cat(values)
    return tuple(x for v in values for x in v)


class BatchOps:
    """Batch verbs shared by the dataclasses below (they only need their fields to follow the three kinds)."""

    def _batch_fields(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def _check_sizes(self) -> None:
        sizes = {
            name: (v.shape[0] if isinstance(v, torch.Tensor) else len(v))
            for name, v in self._batch_fields()
            if v is not None and not isinstance(v, BatchMeta)
        }
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{type(self).__name__} fields disagree on batch size: {sizes}")

    def __len__(self) -> int:
        for _, v in self._batch_fields():
            if v is not None and not isinstance(v, BatchMeta):
                return int(v.shape[0]) if isinstance(v, torch.Tensor) else len(v)
        return 0

    def select(self, index: Index) -> Self:
        """Rows ``index`` (indices or a boolean mask) of every per-sample field."""
        idx = _as_index(index, len(self))
        return type(self)(**{name: _take(v, idx) for name, v in self._batch_fields()})

    def split(self, n: int) -> list[Self]:
        """``min(n, len)`` consecutive parts whose sizes differ by at most one (shards for ``n`` workers)."""
        size = len(self)
        n = max(1, min(n, size))
        bounds = [size * i // n for i in range(n + 1)]
        return [self.select(torch.arange(bounds[i], bounds[i + 1])) for i in range(n)]

    def split_by_size(self, size: int) -> list[Self]:
        """Consecutive parts of ``size`` samples (the last one may be shorter): mini- and micro-batches."""
        if size < 1:
            raise ValueError(f"split_by_size needs size >= 1, got {size}")
        return [self.select(torch.arange(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    @classmethod
    def concat(cls, batches: Sequence[Self]) -> Self:
        """Stack batches along the batch dimension (tensor widths must match; ``meta`` of the first is kept)."""
        if not batches:
            raise ValueError(f"{cls.__name__}.concat: no batches")
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        return cls(**{n: _cat([getattr(b, n) for b in batches], n) for n in names})

    def repeat_interleave(self, n: int) -> Self:
        """Each sample ``n`` times in a row: ``[a, b] -> [a, a, b, b]`` for ``n = 2`` (GRPO groups stay adjacent)."""
        if n < 1:
            raise ValueError(f"repeat_interleave needs n >= 1, got {n}")
        return self.select(torch.arange(len(self)).repeat_interleave(n))

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields replaced (sizes are checked again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class PromptBatch(BatchOps):
    """Prompts of one step (or of a validation set), already tokenized, one entry per sample.

    After ``repeat_interleave(n)`` a prompt appears ``n`` times in a row; its samples share ``uids[i]``, the
    row's globally unique id (``extra_info.id``), which keys the GRPO group.

    Fields:
        prompt_ids: (B,) tuples of prompt token ids (the chat template applied, no padding).
        uids: (B,) globally unique row ids; equal for the samples of one prompt.
        data_sources: (B,) the rows' ``data_source`` (selects the reward function; metrics are split by it).
        targets: (B,) tuples of gold answers.
        questions: (B,) the bare questions (for dumps and baselines).
        row_indices: (B,) position of the row in its dataset (for dumps).
    """

    prompt_ids: tuple[tuple[int, ...], ...]
    uids: tuple[str, ...]
    data_sources: tuple[str, ...]
    targets: tuple[tuple[str, ...], ...]
    questions: tuple[str, ...]
    row_indices: tuple[int, ...]

    def __post_init__(self) -> None:
        self._check_sizes()


@dataclass(frozen=True)
class TrainBatch(BatchOps):
    """Collated trajectories plus everything the update phases add, as padded tensors.

    Prompts are left-padded to ``P``, responses right-padded to ``T`` (``TrainBatch.from_trajectories``, the one
    collation).
    Optional fields are ``None`` until the phase that fills them.

    Fields:
        input_ids: (B, P+T) prompt then response token ids.
        attention_mask: (B, P+T) 1 on real tokens, 0 on padding.
        position_ids: (B, P+T) positions of real tokens.
        response_ids: (B, T) the response slice of ``input_ids``.
        response_mask: (B, T) 1 = sampled from the policy, 0 = inserted observation or padding.
        rollout_logprobs: (B, T) the engine's sampling log-probs (0 where ``response_mask`` is 0).
        uids: (B,) group keys (globally unique prompt ids).
        data_sources: (B,) the rows' data sources.
        sample_mask: (B,) 1 = the sample enters the loss, 0 = left out (a failed search); None = all enter.
        loss_mask: (B, T) tokens every loss, KL, entropy and advantage uses (``algorithms.loss_mask_for``, zero on
            the rows ``sample_mask`` leaves out).
        token_level_scores: (B, T) task reward, on the last model token of each response.
        token_level_rewards: (B, T) scores after the KL-in-reward penalty (= scores when it is off).
        old_logprobs: (B, T) log-probs under the policy that sampled (recomputed by the actor).
        ref_logprobs: (B, T) log-probs under the reference policy.
        values: (B, T) critic values (``gae`` only).
        advantages: (B, T) advantages, 0 outside ``loss_mask``.
        returns: (B, T) critic targets / reward-to-go.
        meta: step and weight version.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    uids: tuple[str, ...]
    data_sources: tuple[str, ...]
    sample_mask: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    token_level_scores: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    meta: BatchMeta = BatchMeta()

    def __post_init__(self) -> None:
        self._check_sizes()

    @property
    def prompt_length(self) -> int:
        """P, the padded prompt width."""
        return int(self.input_ids.shape[1] - self.response_ids.shape[1])

    @property
    def response_attention_mask(self) -> torch.Tensor:
        """(B, T) 1 on every real response token (model or observation), 0 on padding."""
        return self.attention_mask[:, self.prompt_length :]

    def require(self, *names: str) -> None:
        """Raise if any named optional field is still None (a phase ran out of order)."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"TrainBatch is missing {missing}; the phase that fills them has not run")

    @staticmethod
    def from_trajectories(
        trajectories: Sequence[Trajectory],
        uids: Sequence[str],
        data_sources: Sequence[str],
        *,
        pad_token_id: int,
        response_width: int = 0,
        meta: BatchMeta = BatchMeta(),
    ) -> TrainBatch:
        """Collate, once: prompts left-padded to the longest prompt ``P``, responses right-padded to
        ``T = max(response_width, longest response)`` (a fixed ``max_response_tokens`` keeps ``T`` equal across
        steps, which ``seq-mean-token-sum-norm`` divides by); position ids from the attention mask.

        Raises:
            ValueError: no trajectories, or ``uids`` / ``data_sources`` of another length.
        """
        if not trajectories:
            raise ValueError("TrainBatch.from_trajectories: no trajectories")
        b = len(trajectories)
        if len(uids) != b or len(data_sources) != b:
            raise ValueError(f"{b} trajectories but {len(uids)} uids and {len(data_sources)} data sources")
        p = max(int(t.prompt_ids.shape[0]) for t in trajectories)
        t_max = max([response_width, *(int(t.response_ids.shape[0]) for t in trajectories)])
        input_ids = torch.full((b, p + t_max), pad_token_id, dtype=torch.long)  # (B, P+T)
        attention = torch.zeros((b, p + t_max), dtype=torch.long)  # (B, P+T)
        response_mask = torch.zeros((b, t_max), dtype=torch.long)  # (B, T)
        logprobs = torch.zeros((b, t_max), dtype=torch.float32)  # (B, T)
        for i, traj in enumerate(trajectories):
            n_p, n_t = traj.prompt_ids.shape[0], traj.response_ids.shape[0]
            input_ids[i, p - n_p : p] = traj.prompt_ids
            input_ids[i, p : p + n_t] = traj.response_ids
            attention[i, p - n_p : p + n_t] = 1
            response_mask[i, :n_t] = traj.response_mask
            if traj.rollout_logprobs is not None:
                logprobs[i, :n_t] = traj.rollout_logprobs
        return TrainBatch(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),  # (B, P+T)
            response_ids=input_ids[:, p:].clone(),
            response_mask=response_mask,
            rollout_logprobs=logprobs,
            uids=tuple(uids),
            data_sources=tuple(data_sources),
            meta=meta,
        )
