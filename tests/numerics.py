"""Tolerances for tests that compare two computations of the same values, derived from floating-point arithmetic.

Two computations of the same sum in a different order (chunked vs full, a different micro-batching, batched vs one
row, cached vs recomputed, another CPU's matmul kernel) agree only to rounding. Summing ``n`` terms in any order is
off the exact sum by at most ``(n - 1) * eps * sum|terms|`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., §4.2), so two orders differ by at most ``2 * n * eps * sum|terms|``. The tests bound
``sum|terms|`` by the largest magnitude of the compared values (their scale) and take ``n`` from the computation:
the longest reduction feeding one value (the tokens summed into a weight gradient, the sequence a log-prob attends
over); the shorter reductions before it in a network add to it to first order, which the bound's slack covers. It
is a worst-case bound, every rounding erring the same way, where real ones have random signs and grow like
``sqrt(n)``: measured differences are a few ``eps``, so the bound holds on every CPU (oneDNN's AVX-512 or AMX
kernels block and sum in other orders than AVX2's) while an error of the kind the tests look for (a wrong token,
scale or mask) is orders of magnitude larger. Checked here on AVX2 with ATen's vector kernels on and off
(``ATEN_CPU_CAPABILITY=default``) and with 1 and 2 threads.

Where a result passes through something that amplifies last-bit differences (Adam's division by ``sqrt(v) + eps``,
an argmax over near-ties, a threshold), compare what comes before it (``worker_factory.assert_same_adamw_step``,
``assert_same_top_k``).

Import it by name (``from numerics import ...``): ``tests/`` is on ``sys.path`` through its ``conftest.py``.
"""

from __future__ import annotations

import numpy as np
import torch

FP32_EPS = torch.finfo(torch.float32).eps
"""float32 machine epsilon, 2**-23 (1.19e-7)."""

BF16_EPS = torch.finfo(torch.bfloat16).eps
"""bfloat16 machine epsilon, 2**-7 (7.8e-3): 8 bits of mantissa."""


def reorder_tol(n_terms: int, eps: float = FP32_EPS) -> float:
    """The relative bound ``2 * n * eps`` on two summation orders of ``n_terms`` terms (the module docstring).

    >>> round(reorder_tol(1000), 7)
    0.0002384
    """
    if n_terms < 1:
        raise ValueError(f"n_terms must be >= 1, got {n_terms}")
    return 2 * n_terms * eps


def value_scale(expected: torch.Tensor, rows: bool = False) -> torch.Tensor:
    """The largest ``|expected|``, or with ``rows`` each row's largest (shape ``(..., 1)``) for a matrix whose rows
    sum terms of their own size (a weight gradient's row ``i`` sums ``delta_t[i] * x_t``: the tied vocabulary
    matrix's rows of unsampled tokens are 1e-5 of the sampled ones')."""
    values = expected.detach().abs()
    if rows and values.dim() >= 2:
        return values.amax(dim=-1, keepdim=True)
    return values.max() if values.numel() else torch.zeros(())


def assert_reordered_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    n_terms: int,
    *,
    eps: float = FP32_EPS,
    scale: float | torch.Tensor | None = None,
    rows: bool = False,
    msg: str | None = None,
) -> None:
    """Assert ``actual`` equals ``expected`` up to two summation orders of ``n_terms`` terms each.

    The bound is absolute, ``reorder_tol(n_terms, eps) * scale`` for every element, with ``scale`` the largest
    ``|expected|`` (of each row with ``rows``, ``value_scale``) unless given: an element near zero (a gradient entry
    whose terms cancel) carries the rounding of the terms that cancelled, which is of the scale, not of its own value.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{msg or 'values'}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    if scale is None:
        scale = value_scale(expected, rows)
    bound = reorder_tol(n_terms, eps) * torch.as_tensor(scale, dtype=torch.float64)
    diff = (actual.detach().double() - expected.detach().double()).abs()
    off = ~(diff <= bound)  # NaN differences count as off
    if off.any():
        worst = int(torch.nan_to_num(diff - bound, nan=float("inf")).argmax())
        raise AssertionError(
            f"{msg or 'values'}: {int(off.sum())} of {off.numel()} elements differ by more than 2 * {n_terms} terms"
            f" * eps {eps:.3g} * scale; worst at flat index {worst}: {float(actual.flatten()[worst])} vs"
            f" {float(expected.flatten()[worst])}, bound {float(bound.expand_as(diff).flatten()[worst]):.3g}"
        )


def assert_same_top_k(ids, scores, want_ids, want_scores, atol: float, msg: str = "") -> None:
    """Assert a top-k search (``ids``, ``scores``: ``(queries, k)``, best first) equals ``want`` up to ties that
    rounding can break either way: the scores agree within ``atol`` rank by rank, and so do the ids at every rank
    whose score is more than ``atol`` from its neighbours'. Ranks within ``atol`` of each other may come in either
    order, and at the last rank any item within ``atol`` may stand (the one ranked k + 1 may be its tie).
    """
    scores, want_scores = np.asarray(scores, dtype=np.float64), np.asarray(want_scores, dtype=np.float64)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=atol, err_msg=msg)
    apart = np.abs(np.diff(want_scores, axis=-1)) > atol  # (queries, k - 1): rank i and i + 1 cannot swap
    fixed = np.ones(want_scores.shape, dtype=bool)  # (queries, k)
    fixed[..., 1:] &= apart
    fixed[..., :-1] &= apart
    fixed[..., -1] = False

    def kept(rows) -> list[list[object]]:  # the ids at the fixed ranks, None where rounding may reorder them
        pairs = zip(rows, fixed, strict=True)
        return [[i if keep else None for i, keep in zip(row, m, strict=True)] for row, m in pairs]

    got, want = kept(ids), kept(want_ids)
    assert got == want, f"{msg}: ranks apart by more than {atol:.3g} differ: {got} != {want}"
