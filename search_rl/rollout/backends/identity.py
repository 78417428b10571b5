"""``BackendIdentity``: which search engine answered (a backend's fingerprint).

Every backend describes itself with one: the corpus and index of an HTTP retriever (its ``/health``), the web provider
and the day, the simulating model and prompt. Its ``id`` keys a recording's entries, and its facts travel with run
manifests and evaluation fingerprints, so two results can be checked to come from the same search engine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BackendIdentity:
    """What identifies a search backend's answers: ``backend`` (http, web, simulated) and its facts."""

    backend: str
    facts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, backend: str, **facts: Any) -> BackendIdentity:
        """A fingerprint from keyword facts (values stringified, ``None`` dropped, sorted)."""
        return cls(backend, tuple(sorted((k, str(v)) for k, v in facts.items() if v is not None)))

    @classmethod
    def parse(cls, description: str) -> BackendIdentity:
        """The fingerprint of a ``describe()`` string (as stored in a recording)."""
        facts = dict(json.loads(description))
        return cls(str(facts.pop("backend")), tuple(sorted((k, str(v)) for k, v in facts.items())))

    def as_dict(self) -> dict[str, str]:
        """``{"id": ..., "backend": ..., <fact>: ...}`` (for run manifests)."""
        return {"id": self.id, "backend": self.backend, **dict(self.facts)}

    def keys(self) -> list[str]:
        """With ``__getitem__``: ``dict(fingerprint)`` is ``as_dict()`` (what manifests and eval fingerprints take)."""
        return list(self.as_dict())

    def __getitem__(self, name: str) -> str:
        return self.as_dict()[name]

    @property
    def id(self) -> str:
        """16 hex digits of the sha256 of the canonical JSON (stable across processes and machines)."""
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]

    def describe(self) -> str:
        """Canonical JSON: ``{"backend": ..., <fact>: ...}``."""
        return json.dumps({"backend": self.backend, **dict(self.facts)}, sort_keys=True)
