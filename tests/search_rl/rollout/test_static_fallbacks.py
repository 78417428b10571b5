"""The static engine falls back to what has run, once per failure, with one warning naming the stage and a count in
``fallbacks``: an exception while capturing or replaying a decode step, or a replay that differs from its eager step
(one corrupted row of 64; a value frozen at capture, seen only by the second checked replay), drops the graphs; an
exception from the compiled forward swaps in the uncompiled one. Every call still gives the eager engine's tokens.
Graph stand-ins run the plumbing on CPU.

Run: python -m pytest tests/search_rl/rollout/test_static_fallbacks.py -q
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.rollout.engines.static import StaticEngine
from search_rl.rollout.engines.static import engine as static_engine
from search_rl.rollout.engines.static.step_graphs import replay_bound

PROMPTS = ["The capital of France is", "Hi", "A much longer prompt that needs left padding in a batch of three"]
GREEDY = SamplingParams(max_new_tokens=4, greedy=True)


def _ids(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _tokens(out: list[Generated]) -> list[tuple[tuple[int, ...], str | None]]:
    return [(g.token_ids, g.finish_reason) for g in out]


@pytest.fixture(scope="module")
def expected(tiny_model, tokenizer) -> list[tuple[tuple[int, ...], str | None]]:
    """The eager engine's greedy tokens for ``PROMPTS``."""
    return _tokens(StaticEngine(tiny_model, tokenizer, cuda_graphs=False).generate(_ids(tokenizer, PROMPTS), GREEDY))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == static_engine.__name__]


class Rerun:
    """A correct stand-in graph: ``replay`` re-runs the captured step into the captured output."""

    replays = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        Rerun.replays += 1
        self.out.copy_(self.fn())


class RaisesIn(Rerun):
    """Raises where a CUDA graph can: in ``capture`` or in ``replay``."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.stage == "capture":
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().capture(fn)

    def replay(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("stage", ["capture", "replay"])
def test_an_exception_in_capture_or_replay_falls_back_to_eager(tiny_model, tokenizer, expected, caplog, stage):
    prompts = _ids(tokenizer, PROMPTS)
    engine = StaticEngine(tiny_model, tokenizer, graph_factory=lambda: RaisesIn(stage))
    with caplog.at_level(logging.WARNING):
        assert _tokens(engine.generate(prompts, GREEDY)) == expected
        assert _tokens(engine.generate(prompts, GREEDY)) == expected
    assert engine.fallbacks == {stage: 1} and engine.graph_fallbacks == 1 and not engine.use_graphs
    [warning] = _warnings(caplog)  # one, however many calls follow
    assert f"{stage} fallback: {stage} of the decode step" in warning and "RuntimeError" in warning
    assert "decoding eagerly from now on" in warning


def _raising_compile(fn: Callable, **kwargs: object) -> Callable:
    def compiled(*args: object, **kw: object) -> object:
        raise RuntimeError("inductor: C++ compile error")

    return compiled


@pytest.mark.parametrize("graphs", [False, True])
def test_an_exception_from_the_compiled_forward_falls_back_to_the_uncompiled_one(
    tiny_model, tokenizer, expected, caplog, monkeypatch, graphs
):
    """The compiled kernels raise at their first call (the prefill): the uncompiled forward takes over, and the
    captured steps (when on) are kept, since they did not fail."""
    monkeypatch.setattr(torch, "compile", _raising_compile)
    prompts = _ids(tokenizer, PROMPTS)
    engine = StaticEngine(tiny_model, tokenizer, compiled=True, graph_factory=Rerun if graphs else None)
    with caplog.at_level(logging.WARNING):
        assert _tokens(engine.generate(prompts, GREEDY)) == expected
        assert _tokens(engine.generate(prompts, GREEDY)) == expected
    assert engine.fallbacks == {"compile": 1} and engine.graph_fallbacks == 0 and not engine.decoder.compiled
    assert engine.use_graphs is graphs and (engine.captures > 0) is graphs
    assert engine.compiled, "what it was built with stays recorded (the evaluation fingerprint pins it)"
    [warning] = _warnings(caplog)
    assert "compile fallback: the compiled forward raised RuntimeError: inductor: C++ compile error" in warning


def test_an_error_of_the_eager_path_is_raised_not_swallowed(tiny_model, tokenizer, monkeypatch):
    engine = StaticEngine(tiny_model, tokenizer, graph_factory=Rerun)

    def broken(*args: object) -> None:
        raise ValueError("a bug in sampling")

    monkeypatch.setattr(engine, "_sample_advance", broken)
    with pytest.raises(ValueError, match="a bug in sampling"):
        engine.generate(_ids(tokenizer, PROMPTS), GREEDY)
    assert not engine.fallbacks


class ScaleRow(Rerun):
    """Scales one row's replayed logits by ``factor`` (after the step sampled: its tokens stay right)."""

    def __init__(self, row: int, factor: float) -> None:
        self.row, self.factor = row, factor

    def replay(self) -> None:
        super().replay()
        self.out[self.row] *= self.factor


def test_one_corrupted_row_of_64_falls_back(tiny_model, tokenizer, caplog):
    """Row 5 of 64 live rows off by 4x the float32 replay bound: one norm over the batch would see about an eighth
    of that (under the bound); the per-row check sees it, and the engine falls back."""
    prompts = (_ids(tokenizer, PROMPTS) * 22)[:64]
    cfg = HFEngineConfig(max_batch_size=64)
    factor = 1 + 4 * replay_bound(torch.float32)
    engine = StaticEngine(tiny_model, tokenizer, cfg, graph_factory=lambda: ScaleRow(5, factor))
    eager = StaticEngine(tiny_model, tokenizer, cfg, cuda_graphs=False)
    params = SamplingParams(max_new_tokens=2, greedy=True)
    with caplog.at_level(logging.WARNING):
        assert _tokens(engine.generate(prompts, params)) == _tokens(eager.generate(prompts, params))
    assert engine.fallbacks == {"mismatch": 1}
    [warning] = _warnings(caplog)
    assert "mismatch fallback" in warning and "(64, 128" in warning and "row 5 by" in warning


class FrozenPositions(Rerun):
    """A graph that froze the decode positions it was captured at (a value taken from Python at capture): right on
    the capture's own inputs, stale from the next step on."""

    def __init__(self, engine: Callable[[], StaticEngine]) -> None:
        self.engine = engine

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        state = self.engine()._state
        assert state is not None
        self.pos = state.pos.clone()
        return super().capture(fn)

    def replay(self) -> None:
        state = self.engine()._state
        assert state is not None
        state.pos.copy_(self.pos)
        super().replay()


def test_the_second_checked_replay_catches_a_value_frozen_at_capture(tiny_model, tokenizer, expected, caplog):
    """The first checked replay runs on the capture's inputs and passes; the second, one step later, differs, and
    the engine falls back (with one check only, every later step would decode from stale positions)."""
    prompts = _ids(tokenizer, PROMPTS)
    engine: StaticEngine | None = None

    def current() -> StaticEngine:
        assert engine is not None
        return engine

    engine = StaticEngine(tiny_model, tokenizer, graph_factory=lambda: FrozenPositions(current))
    with caplog.at_level(logging.WARNING):
        assert _tokens(engine.generate(prompts, GREEDY)) == expected
    assert engine.fallbacks == {"mismatch": 1} and engine.graphs.checks == 2
