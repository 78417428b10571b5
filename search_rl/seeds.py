"""Every seed of a run, derived from ``trainer.seed`` in one place.

A run is reproducible (and a resumed run continues the uninterrupted one) because each random stream is a pure
function of the run seed and where it is used: the step, the data-parallel rank, the turn of an episode, the sample
in a request, the epoch of the data or of the mini-batch shuffle. The constants are odd primes far apart, so streams
of neighbouring steps, ranks and turns never coincide.
"""

from __future__ import annotations

RANK_STRIDE = 100_003
"""Distance between the sampling seeds of two data-parallel ranks (and of two shards of a generator's unit)."""
TURN_STRIDE = 1_000_003
"""Distance between the sampling seeds of two turns of one episode."""


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """The sampling seed of training step ``step`` (``salt`` varies it within a step: dynamic sampling's batches).

    >>> step_seed(0, 1), step_seed(0, 1, salt=1)
    (9176, 9177)
    """
    return (seed * 1_000_003 + step * 9_176 + salt) % (2**62)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of data-parallel rank ``rank`` (or shard ``rank`` of a generator's unit) given the step's seed."""
    return seed + RANK_STRIDE * rank


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The seed of turn ``turn`` of an episode (``None``: unseeded)."""
    return None if seed is None else seed + TURN_STRIDE * turn


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of the ``index``-th sequence of one engine request (``None``: unseeded)."""
    return None if seed is None else seed + index


def engine_seed(seed: int, rank: int) -> int:
    """The seed an engine is built with on rank ``rank`` (vLLM's own default stream)."""
    return seed + rank


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of data epoch ``epoch``."""
    return seed + epoch


def minibatch_shuffle_seed(seed: int, step: int, rank: int) -> int:
    """The seed of the actor's mini-batch shuffle at ``step`` on ``rank``."""
    return (seed * 1_000_003 + step) * 7 + rank
