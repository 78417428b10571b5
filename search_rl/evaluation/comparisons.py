"""Which evaluations may share a table: their fingerprints (``evaluation.fingerprint``) must agree, except where the
reader says a difference is intended.

``model`` differences are intended by default (comparing models is the point of the table); ``packages`` are not:
a transformers upgrade can change greedy decoding. Intended differences are named by a dotted key or a prefix of
one (``retriever`` allows every retriever key, ``retriever.topk`` only the top-k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from search_rl.evaluation.fingerprint import flatten

DEFAULT_INTENDED = ("model",)
"""Fingerprint sections that may differ without being named (``compare_evals --allow``)."""
MISSING = "<absent>"
"""How a key one fingerprint has and another lacks is shown."""


def _intended(key: str, allow: Sequence[str]) -> bool:
    """Whether ``key`` falls under one of the ``allow`` prefixes (whole dotted parts only).

    >>> _intended("retriever.topk", ["retriever"]), _intended("retriever.topk", ["retriever.top"])
    (True, False)
    """
    return any(key == a or key.startswith(a + ".") for a in allow)


def differences(fingerprints: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Every dotted key whose value is not the same in all fingerprints, with the value of each (``MISSING`` where a
    fingerprint lacks the key).

    >>> differences([{"retriever": {"topk": 3}}, {"retriever": {"topk": 5}}, {"retriever": {"topk": 3}}])
    {'retriever.topk': [3, 5, 3]}
    """
    flat = [flatten(fp) for fp in fingerprints]
    keys = sorted({k for f in flat for k in f})
    out: dict[str, list[Any]] = {}
    for key in keys:
        values = [f.get(key, MISSING) for f in flat]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def _show(value: Any) -> str:
    text = str(value)
    return text[:12] + "…" if len(text) > 16 and all(c in "0123456789abcdef" for c in text) else text


def describe(diffs: Mapping[str, list[Any]], names: Sequence[str]) -> list[str]:
    """One line per differing key: ``retriever.topk: a=3, b=5``."""
    return [f"{k}: " + ", ".join(f"{n}={_show(v)}" for n, v in zip(names, vs, strict=True)) for k, vs in diffs.items()]


def check_comparable(
    names: Sequence[str],
    fingerprints: Sequence[Mapping[str, Any] | None],
    allow: Sequence[str] = (),
) -> list[str]:
    """The intended differences between the runs' fingerprints, described; refuses unintended ones.

    Args:
        names: the runs' names, in table order.
        fingerprints: their fingerprints (None for an evaluation made before fingerprints existed: noted, not
            checked).
        allow: intended differences besides ``DEFAULT_INTENDED`` (dotted keys or prefixes).

    Returns:
        The lines naming the runs without a fingerprint and describing the intended differences (empty when the
        fingerprints agree).

    Raises:
        ValueError: differences not allowed, each named with every run's value and the ``--allow`` that would accept
            it.
    """
    unpinned = [n for n, fp in zip(names, fingerprints, strict=True) if fp is None]
    notes = [f"not pinned (evaluated before fingerprints, not checked): {', '.join(unpinned)}"] if unpinned else []
    pinned = [(n, fp) for n, fp in zip(names, fingerprints, strict=True) if fp is not None]
    if len(pinned) < 2:
        return notes
    diffs = differences([fp for _, fp in pinned])
    shown = [n for n, _ in pinned]
    allowed = (*DEFAULT_INTENDED, *allow)
    refused = {k: v for k, v in diffs.items() if not _intended(k, allowed)}
    if refused:
        sections = sorted({k.split(".")[0] for k in refused})
        raise ValueError(
            "these evaluations were not made the same way:\n  "
            + "\n  ".join(describe(refused, shown))
            + f"\nIf the differences are intended, say so: --allow {' --allow '.join(sections)} "
            "(or a narrower dotted key)"
        )
    return notes + describe(diffs, shown)
