"""Which evaluations may share a table: their fingerprints (``evaluation.fingerprint``) must agree, except where the
reader says a difference is intended.

``model`` differences are intended by default (comparing models is the point of the table); ``packages`` are not:
a transformers upgrade can change greedy decoding. Intended differences are named by a dotted key or a prefix of
one (``retriever`` allows every retriever key, ``retriever.topk`` only the top-k).

A row that cannot be checked is refused too, unless named: one without a fingerprint (``--allow fingerprint``), one
whose retriever said nothing to pin it on (``retriever.unpinned``: ``--allow retriever.unpinned``).

Keys that say why a value is what it is (``RECORDED_ONLY``: ``engine.dtype_reason``) are written for the reader and
never compared; the value they explain is (``engine.dtype``): bfloat16 picked by ``model.dtype=auto`` and bfloat16
named in the config compute alike.

A key that one fingerprint has and another lacks differs (shown ``<absent>``) and is refused unless named: a result
written before its search-rl recorded the key (the ``rollout`` section: schedule, batch sizes, prefix reuse) ran with
a value nobody knows, so it is not assumed to be the default. Such older results stay readable; evaluate them again,
or name the keys (``--allow rollout``) to compare them anyway. Keys that every fingerprint lacks are not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from search_rl.evaluation.fingerprint import flatten

DEFAULT_INTENDED = ("model",)
"""Fingerprint sections that may differ without being named (``compare_evals --allow``)."""
MISSING = "<absent>"
"""How a key one fingerprint has and another lacks is shown."""
RECORDED_ONLY = ("engine.dtype_reason",)
"""Fingerprint keys that explain another key's value: recorded, never compared."""
NO_FINGERPRINT = "fingerprint"
"""The ``--allow`` key of rows without a fingerprint (evaluated before fingerprints existed)."""
UNPINNED = "unpinned"
"""The key a fingerprint section holds, with the reason, when what it describes could not be pinned."""


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


def gaps(names: Sequence[str], fingerprints: Sequence[Mapping[str, Any] | None]) -> dict[str, list[str]]:
    """What cannot be checked, by ``--allow`` key: ``fingerprint`` (rows without one) and ``<section>.unpinned``
    (rows whose section says why it is not pinned), each with a line per row.

    >>> gaps(["a", "b"], [None, {"retriever": {"backend": "http", "unpinned": "no /health"}}])
    {'fingerprint': ['a: no fingerprint'], 'retriever.unpinned': ['b: retriever not pinned (no /health)']}
    """
    out: dict[str, list[str]] = {}
    for name, fp in zip(names, fingerprints, strict=True):
        if fp is None:
            out.setdefault(NO_FINGERPRINT, []).append(f"{name}: no fingerprint")
            continue
        for section, body in fp.items():
            if isinstance(body, Mapping) and UNPINNED in body:
                out.setdefault(f"{section}.{UNPINNED}", []).append(f"{name}: {section} not pinned ({body[UNPINNED]})")
    return out


def check_comparable(
    names: Sequence[str],
    fingerprints: Sequence[Mapping[str, Any] | None],
    allow: Sequence[str] = (),
) -> list[str]:
    """The intended differences between the runs' fingerprints, described; refuses unintended ones and rows that
    cannot be checked (``gaps``) unless ``allow`` names them.

    Args:
        names: the runs' names, in table order.
        fingerprints: their fingerprints (None for an evaluation made before fingerprints existed).
        allow: intended differences besides ``DEFAULT_INTENDED`` (dotted keys or prefixes), ``fingerprint`` for rows
            without one, ``retriever.unpinned`` for rows whose retriever was not pinned.

    Returns:
        The lines naming the allowed gaps and describing the intended differences (empty when the fingerprints
        agree).

    Raises:
        ValueError: a row without a fingerprint or with an unpinned section, or a difference, that ``allow`` does not
            name; each named with the row (or every run's value) and the ``--allow`` that would accept it.
    """
    if len(names) < 2:
        return []
    allowed = (*DEFAULT_INTENDED, *allow)
    found = gaps(names, fingerprints)
    refused_gaps = {k: v for k, v in found.items() if not _intended(k, allowed)}
    if refused_gaps:
        raise ValueError(
            "these evaluations cannot be checked against each other:\n  "
            + "\n  ".join(
                f"{line} (to compare it unchecked: --allow {k})" for k, v in refused_gaps.items() for line in v
            )
            + "\nPin them by evaluating again with main_eval (against a retriever that answers GET /health), or name "
            "each gap with --allow"
        )
    notes = [f"{line}: not checked (--allow {k})" for k, v in found.items() for line in v]
    pinned = [(n, fp) for n, fp in zip(names, fingerprints, strict=True) if fp is not None]
    if len(pinned) < 2:
        return notes
    skipped = {*found, *RECORDED_ONLY}
    diffs = {k: v for k, v in differences([fp for _, fp in pinned]).items() if k not in skipped}
    shown = [n for n, _ in pinned]
    refused = {k: v for k, v in diffs.items() if not _intended(k, allowed)}
    if refused:
        sections = sorted({k.split(".")[0] for k in refused})
        unrecorded = any(MISSING in v for v in refused.values())
        raise ValueError(
            "these evaluations were not made the same way:\n  "
            + "\n  ".join(describe(refused, shown))
            + (
                f"\n{MISSING}: that result does not record the key (an older search-rl wrote it, or its retriever did "
                "not report it), so what it ran with is unknown"
                if unrecorded
                else ""
            )
            + f"\nIf the differences are intended, say so: --allow {' --allow '.join(sections)} "
            "(or a narrower dotted key)"
        )
    return notes + describe(diffs, shown)
