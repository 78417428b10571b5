"""Tolerances for tests that compare two computations of the same values, derived from floating-point arithmetic.

Two computations of the same sum in a different order (chunked vs full, a different micro-batching, batched vs one
row, cached vs recomputed, another CPU's matmul kernel) agree only to rounding. Summing ``n`` terms in any order is
off the exact sum by at most ``(n - 1) * eps * sum|terms|`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., §4.2), so two orders differ by at most ``2 * n * eps * sum|terms|``: ``reorder_tol(n)`` is that
bound relative to ``sum|terms|``, and ``assert_reordered_close`` multiplies it by a ``scale`` that must be
``sum|terms|`` (or an upper bound of it) for each compared value.

The scale is where the bound holds or not. The largest ``|value|`` (the default) is ``sum|terms|`` only where the
terms share a sign: a norm, a softmax's normaliser, BM25's per-term scores, a mean of NLLs, the weighted average of
attention (weights >= 0 summing to 1, so the scale of the values). Where terms cancel, a value can be far below
``sum|terms|`` and its rounding is of the latter: a weight gradient sums per-token terms of both signs (pass
``worker_factory.GradientTerms``' sums), a log-prob ``z_s - logsumexp(z)`` and an entropy subtract numbers of the
logits' size (pass ``logprob_scale``), a dot product of unit vectors has ``sum|q_i p_i| <= 1`` (Cauchy-Schwarz). ``n``
is taken from the computation: the longest reduction feeding one value (the tokens summed into a weight gradient, the
sequence a log-prob attends over); the shorter reductions before it add to it to first order, relative to their own
term sums, which the bound's slack covers. It is a worst-case bound, every rounding erring the same way, where real
ones have random signs and grow like ``sqrt(n)``: measured differences are a few ``eps``, so the bound holds on every
CPU (oneDNN's AVX-512 or AMX kernels block and sum in other orders than AVX2's) while an error of the kind the tests
look for (a wrong token, scale or mask) is orders of magnitude larger. Checked here on AVX2 with ATen's vector kernels
on and off (``ATEN_CPU_CAPABILITY=default``) and with 1 and 2 threads.

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
    """The bound ``2 * n * eps`` on two summation orders of ``n_terms`` terms, relative to the sum of the terms'
    absolute values (not to the sum's value, which is smaller where terms cancel; the module docstring).

    >>> round(reorder_tol(1000), 7)
    0.0002384
    """
    if n_terms < 1:
        raise ValueError(f"n_terms must be >= 1, got {n_terms}")
    return 2 * n_terms * eps


def value_scale(expected: torch.Tensor) -> torch.Tensor:
    """The largest ``|expected|``: ``sum|terms|`` of values whose terms share a sign (the module docstring), not of
    ones whose terms cancel."""
    values = expected.detach().abs()
    return values.max() if values.numel() else torch.zeros(())


def logit_terms(hidden: torch.Tensor, head: torch.Tensor) -> float:
    """The largest ``sum|terms|`` of a logit ``hidden . head_j``: ``max |hidden| . |head_j|`` over the rows of
    ``hidden`` (N, H) and the vocabulary rows of ``head`` (V, H); a logit's rounding is of it, not of ``|z_j|``."""
    hidden, head = hidden.detach().double(), head.detach().double()
    return max((float((rows.abs() @ head.abs().T).max()) for rows in hidden.split(256)), default=0.0)


def logprob_scale(hidden: torch.Tensor, head: torch.Tensor, temperature: float = 1.0, entropy: bool = False) -> float:
    """A ``sum|terms|`` scale for log-probs (or entropies) of the logits ``z = hidden @ head.T / temperature``, for
    ``assert_reordered_close`` with ``n`` the longest reduction behind them (at least ``log2(V)``).

    ``log p = z_s - logsumexp(z)``. Its terms and their errors, each within ``reorder_tol(n)`` times:
    the normaliser ``sum_j exp(z_j - max z)`` (positive terms; its relative error is ``logsumexp``'s absolute one):
    1; a logit, whose sum ``hidden . head_j`` has ``sum|terms| = A_j = |hidden| . |head_j| / temperature``
    (``logit_terms``) and which reaches ``log p`` through ``z_s`` and through the normaliser's ``sum_j p_j z_j``:
    ``2 A``; the subtraction's own rounding, of ``|z_s| + |logsumexp(z)|``. An entropy ``logsumexp(z) - sum_j p_j z_j``
    also moves with each ``p_j`` (by ``p_j`` times the logits' errors, at most ``2 A``), times ``|z_j|``: ``2 A max|z|``
    more. So the scale is ``1 + 2A + max|z| + max|logsumexp(z)|`` (+ ``2 A max|z|`` for entropies), the largest over
    the rows; a log-prob's own size (``|log p|``, the default scale) can be far below it where ``z_s`` and
    ``logsumexp`` nearly cancel (a confident token of a trained model).

    Args:
        hidden: (N, H) the inputs of the output head at the positions whose log-probs are compared.
        head: (V, H) the output head's weight.

    >>> logprob_scale(torch.ones(1, 2), torch.tensor([[1.0, 1.0], [1.0, -1.0]]))  # A 2, max|z| 2, logsumexp 2.13
    9.126928011042972
    """
    hidden, head = hidden.detach().double(), head.detach().double()
    worst = 0.0
    for rows in hidden.split(256):
        z = rows @ head.T / temperature  # (n, V)
        a = logit_terms(rows, head) / temperature
        big = float(z.abs().max())
        scale = 1 + 2 * a + big + float(torch.logsumexp(z, -1).abs().max()) + (2 * a * big if entropy else 0.0)
        worst = max(worst, scale)
    return worst


def head_inputs(model: torch.nn.Module, head: torch.nn.Module, **inputs: object) -> torch.Tensor:
    """What ``model``'s output head ``head`` receives in one no-grad forward over ``inputs``: ``(..., L, H)``."""
    seen: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen[0]


def predicting_inputs(model: torch.nn.Module, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the output head's inputs at the positions that predict ``ids[start:]``, (len(ids) - start, H); the head's
    weight) in a plain forward of ``model`` over ``ids``: what ``logit_terms`` and ``logprob_scale`` take."""
    head = model.get_output_embeddings()
    hidden = head_inputs(model, head, input_ids=torch.tensor([ids]))[0, start - 1 : len(ids) - 1]
    return hidden, head.weight


def assert_reordered_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    n_terms: int,
    *,
    eps: float = FP32_EPS,
    scale: float | torch.Tensor | None = None,
    msg: str | None = None,
) -> None:
    """Assert ``actual`` equals ``expected`` up to two summation orders of ``n_terms`` terms each.

    The bound is absolute, ``reorder_tol(n_terms, eps) * scale`` for every element. ``scale`` (a number or a tensor
    broadcast to the values) must be each value's ``sum|terms|``, or an upper bound of it: pass it wherever the terms
    cancel (the module docstring). Without it, the largest ``|expected|`` (``value_scale``), right for values whose
    terms share a sign.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{msg or 'values'}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    if scale is None:
        scale = value_scale(expected)
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
