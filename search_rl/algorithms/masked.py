"""Masked reductions: means, variances and whitening over the tokens a mask selects.

Every statistic of the RL objective is taken over model-generated tokens only, so these helpers are the one place
where "masked" is defined: ``mask`` is 1 on counted tokens and 0 elsewhere, and an all-zero mask gives 0, not NaN.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8
"""Added to the variance before the square root in ``masked_whiten``."""


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is 1, over ``dim`` (all dims when None).

    >>> masked_sum(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1, 0, 1]))
    tensor(5.)
    """
    masked = x * mask.to(x.dtype)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1; 0 where no position is selected.

    >>> masked_mean(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1, 0, 1]))
    tensor(2.5000)
    """
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all selected positions (Bessel-corrected when ``unbiased`` and at least 2 selected).

    >>> masked_var(torch.tensor([1.0, 9.0, 3.0]), torch.tensor([1, 0, 1]))
    tensor(2.)
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    count = mask.to(x.dtype).sum()
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and (unbiased) variance over selected positions; 0 elsewhere.

    >>> masked_whiten(torch.tensor([1.0, 9.0, 3.0]), torch.tensor([1, 0, 1]))
    tensor([-0.7071,  0.0000,  0.7071])
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS) * mask.to(x.dtype)
