"""Fixtures of the worker tests."""

from __future__ import annotations

import pytest
from worker_factory import build_rollout_batch

from search_rl.batches import TrainBatch


@pytest.fixture(scope="module")
def rollout_batch(tokenizer) -> TrainBatch:
    """A real scored rollout batch of the tiny model (``worker_factory.build_rollout_batch``)."""
    return build_rollout_batch(tokenizer)
