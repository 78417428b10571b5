"""``WeightStore``: where the policy's weights live between the trainer's publish and a generator's pull.

The trainer never pushes weights into a generator (its engine may be in the middle of a unit of work). Instead:

1. after each update the actor group's ``sync_weights(version, publish=True)`` gathers the full state dict (every
   rank joins the gather), and rank 0 ``ray.put``s it, in the compute dtype, tied tensors once, on the CPU, into
   Ray's object store; it returns the object reference wrapped in a list, so Ray hands over the reference, not
   the tensors;
2. the driver records ``(version, reference)`` here, replacing the previous one (whose memory Ray frees once no
   generator still holds it): one version in the store, whatever the number of generators;
3. a generator, between two units of work, asks ``latest()`` and, if the version is newer than its engine's, fetches
   the tensors (a zero-copy read on the same machine) and loads them into its engine.

A plain class made a Ray actor by the coordinator (``ray.remote(WeightStore)``), one per run.
"""

from __future__ import annotations

from typing import Any


class WeightStore:
    """The latest published weights: a version and ``[object ref]`` of its state dict (empty before the first)."""

    def __init__(self) -> None:
        self.version = -1
        self.refs: list[Any] = []

    def publish(self, version: int, refs: list[Any]) -> int:
        """Record ``refs`` as the weights of ``version`` (versions never go back); returns it.

        Raises:
            ValueError: an older version than the stored one, or no reference.
        """
        if version < self.version:
            raise ValueError(f"WeightStore: version {version} is older than the published {self.version}")
        if len(refs) != 1:
            raise ValueError(f"WeightStore: expected one object reference for version {version}, got {len(refs)}")
        self.version, self.refs = version, refs
        return version

    def latest(self) -> tuple[int, list[Any]]:
        """``(version, [ref])`` of the newest weights, ``(-1, [])`` before the first publish."""
        return self.version, self.refs
