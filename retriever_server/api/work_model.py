"""How long the backend takes to search a batch, learnt from the batches it has searched (for load shedding).

The two backends spend differently: BM25's time is nearly all per query (scoring and ranking 16k documents took
1.5-3.5 ms per query whether the query had 50 or 2,048 characters), while the dense encoder's grows with length up to
its 256-token limit. So the model has two rates, ``seconds ~= per_query * queries + per_char * characters``, fitted by
exponentially weighted least squares. While every batch seen has had the same mean query length the two rates cannot
be told apart; a weak prior (a query's fixed cost equals ``PRIOR_QUERY_CHARS`` characters) pins them until batches of
another length arrive, and predictions for the length seen are right either way.
"""

from __future__ import annotations

import numpy as np

PRIOR_QUERY_CHARS = 64.0
"""Prior guess of a query's fixed cost, in characters' worth."""


class WorkModel:
    """Exponentially weighted least-squares fit of batch seconds on (queries, characters)."""

    def __init__(self, decay: float = 0.8, prior_weight: float = 1e-3) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self._xx = np.zeros((2, 2))
        self._xy = np.zeros(2)
        self._rates: tuple[float, float] | None = None
        self.batches = 0

    def add(self, queries: int, chars: int, seconds: float) -> None:
        """Record one searched batch."""
        x = np.array([queries, chars], dtype=np.float64)
        self._xx = self.decay * self._xx + np.outer(x, x)
        self._xy = self.decay * self._xy + x * seconds
        self.batches += 1
        self._rates = self._fit()

    def rates(self) -> tuple[float, float] | None:
        """``(seconds per query, seconds per character)``, both >= 0; ``None`` before the first batch.

        >>> m = WorkModel()
        >>> for q, c in [(256, 12_800), (8, 16_384), (128, 6_400), (16, 32_768)]:
        ...     m.add(q, c, 0.002 * q + 0.00001 * c)
        >>> [f"{r:.2g}" for r in m.rates()]
        ['0.002', '1e-05']
        """
        return self._rates

    def _fit(self) -> tuple[float, float]:
        prior = np.array([1.0, -PRIOR_QUERY_CHARS])  # penalises per_query != PRIOR_QUERY_CHARS * per_char
        weight = self.prior_weight * np.trace(self._xx) / float(prior @ prior)
        per_query, per_char = np.linalg.solve(self._xx + weight * np.outer(prior, prior), self._xy)
        if per_query < 0:  # the data say one rate is ~0; fit the other alone
            return 0.0, max(0.0, float(self._xy[1] / self._xx[1, 1]))
        if per_char < 0:
            return max(0.0, float(self._xy[0] / self._xx[0, 0])), 0.0
        return float(per_query), float(per_char)

    def seconds(self, queries: float, chars: float) -> float | None:
        """Predicted search seconds of that much work; ``None`` before the first batch."""
        rates = self.rates()
        return None if rates is None else rates[0] * queries + rates[1] * chars
