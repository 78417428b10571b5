"""The replay self-check of captured decode steps (``step_graphs.StepGraphs``), on a stand-in step over 64 rows: a
correct replay equals its eager step exactly; one corrupted live row of 64 fails the check at its own difference (a
norm over the whole batch would dilute it below the bound); idle rows are not compared; a differing token fails even
within the bound; the second checked replay is the one that catches a value frozen at capture; an exception while
capturing or replaying becomes a ``GraphError``.

Run: python -m pytest tests/search_rl/rollout/test_step_graphs.py -q
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from search_rl.rollout.engines.static.step_graphs import (
    CHECKED_REPLAYS,
    GraphError,
    GraphMismatch,
    StepGraphs,
    mismatch_bound,
    replay_bound,
    replay_differs,
)

ROWS, VOCAB = 64, 50
BOUND = replay_bound(torch.bfloat16)
"""The bf16 bound (0.016): the dtype the engine runs in on a GPU, where diluting one row mattered."""


class Decode:
    """A decode step over ``ROWS`` rows: each live row's logits are a fixed random row picked by its position; it
    takes the greedy token and advances. Done rows keep their token and position."""

    def __init__(self, done: tuple[int, ...] = ()) -> None:
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(1000, VOCAB, generator=g)  # (positions, V)
        self.pos = torch.arange(ROWS) * 7  # (R,)
        self.tok = torch.zeros(ROWS, dtype=torch.long)  # (R,)
        self.done = torch.zeros(ROWS, dtype=torch.bool)  # (R,)
        self.done[list(done)] = True

    def step(self) -> torch.Tensor:
        logits = self.table[self.pos]  # (R, V)
        live = ~self.done
        self.tok.copy_(torch.where(live, logits.argmax(-1), self.tok))
        self.pos += live.long()
        return logits

    def snapshot(self) -> Callable[[], None]:
        saved = (self.pos.clone(), self.tok.clone())

        def restore() -> None:
            self.pos.copy_(saved[0])
            self.tok.copy_(saved[1])

        return restore

    def run(self, graphs: StepGraphs) -> torch.Tensor:
        return graphs.run("k", self.step, self.snapshot, lambda: self.tok, lambda: ~self.done)


class Rerun:
    """A correct graph: ``replay`` re-runs the captured step into the captured output."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn().clone()
        return self.out

    def replay(self) -> None:
        self.out.copy_(self.fn())


class CorruptRow(Rerun):
    """Scales one row's replayed logits by ``factor`` after the step sampled (its tokens stay right)."""

    def __init__(self, row: int, factor: float) -> None:
        self.row, self.factor = row, factor

    def replay(self) -> None:
        super().replay()
        self.out[self.row] *= self.factor


def _graphs(make: Callable[[], object]) -> StepGraphs:
    return StepGraphs(make, BOUND, torch.device("cpu"))  # type: ignore[arg-type]


def test_a_correct_replay_equals_the_eager_step_exactly_and_is_trusted_after_two_checks():
    decode, graphs = Decode(), _graphs(Rerun)
    for _ in range(5):
        decode.run(graphs)
    assert graphs.captures == 1 and graphs.checks == CHECKED_REPLAYS == 2
    assert graphs.max_difference == 0.0  # the same kernels on the same inputs: bitwise equal


def test_one_corrupted_row_of_64_fails_the_check_at_its_own_difference():
    """Row 17's logits off by 4x the bound: the check names row 17 and its difference, while one norm over the whole
    batch would have seen about an eighth of it, under the bound (what the check used to compute)."""
    factor = 1 + 4 * BOUND
    decode, graphs = Decode(), _graphs(lambda: CorruptRow(17, factor))
    with pytest.raises(GraphMismatch, match=r"row 17 by 0\.0625") as e:
        decode.run(graphs)
    assert e.value.row == 17 and e.value.difference == pytest.approx(4 * BOUND, rel=1e-5)
    eager = Decode().table[Decode().pos]  # (R, V) the step's logits
    replayed = eager.clone()
    replayed[17] *= factor
    whole = float(torch.linalg.vector_norm(replayed - eager) / torch.linalg.vector_norm(eager))
    assert whole < BOUND < e.value.difference


def test_a_corrupted_idle_row_is_not_compared():
    decode, graphs = Decode(done=(17,)), _graphs(lambda: CorruptRow(17, 2.0))
    for _ in range(3):
        decode.run(graphs)
    assert graphs.checks == 2 and graphs.max_difference == 0.0


class FlipToken(Rerun):
    """Logits within the bound (one row off by a quarter of it) but another token for that row: a near tie."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def replay(self) -> None:
        super().replay()
        self.out[3] *= 1 + BOUND / 4
        self.tokens[3] += 1


def test_a_differing_token_fails_the_check_even_with_logits_within_the_bound():
    decode = Decode()
    graphs = _graphs(lambda: FlipToken(decode.tok))
    with pytest.raises(GraphMismatch, match="its sampled tokens differ") as e:
        decode.run(graphs)
    assert 0 < e.value.difference <= BOUND


class FrozenPositions(Rerun):
    """A graph that froze the positions it was captured at (a value taken from Python at capture): right on the
    capture's inputs, stale from the next step on."""

    def __init__(self, decode: Decode) -> None:
        self.decode = decode

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.pos = self.decode.pos.clone()
        return super().capture(fn)

    def replay(self) -> None:
        self.decode.pos.copy_(self.pos)
        super().replay()


def test_the_second_checked_replay_catches_a_value_frozen_at_capture():
    """The first check runs on the inputs the capture saw, so it passes; only the second, at the next step, sees the
    stale positions. Checking one replay only would let this graph decode every later step from stale positions."""
    decode = Decode()
    graphs = _graphs(lambda: FrozenPositions(decode))
    decode.run(graphs)
    assert graphs.checks == 1 and graphs.max_difference == 0.0
    with pytest.raises(GraphMismatch, match="differs from the eager step"):
        decode.run(graphs)


class Raising(Rerun):
    def __init__(self, stage: str) -> None:
        self.stage = stage

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        out = super().capture(fn)  # the warm-up ran the step before the error
        if self.stage == "capture":
            raise RuntimeError("operation not permitted when stream is capturing")
        return out

    def replay(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("stage", ["capture", "replay"])
def test_an_exception_in_capture_or_replay_is_a_graph_error_naming_the_stage(stage):
    decode = Decode()
    graphs = _graphs(lambda: Raising(stage))
    before = decode.pos.clone()
    with pytest.raises(GraphError, match=rf"^{stage} of the decode step k raised RuntimeError") as e:
        decode.run(graphs)
    assert e.value.stage == stage and isinstance(e.value.__cause__, RuntimeError)
    if stage == "capture":
        assert torch.equal(decode.pos, before), "what the capture's warm-up ran is undone"


def test_the_replay_bound_is_a_few_roundoffs_whatever_the_depth():
    assert replay_bound(torch.bfloat16) == 4 * 2.0**-8 and replay_bound(torch.float32) == 4 * 2.0**-24
    assert replay_bound(torch.bfloat16) < mismatch_bound(torch.bfloat16, 36)  # two computations differ more
    logits = torch.ones(2, 3)
    assert replay_differs(logits, logits, torch.tensor([False, False])) == (0.0, -1)
    nan = logits.clone()
    nan[1, 0] = float("nan")
    assert replay_differs(nan, logits, torch.tensor([True, True])) == (float("inf"), 1)
