"""bench/static_engine_bench.py at the tiny size on CPU: each engine's line carries the prefill, decode and end-to-end
rates, the roofline fraction, the commit and versions; timed calls reuse no states unless ``--reuse`` asks, and the
Search-R1 case's second turn reuses its first turn's; the roofline's bytes are the weights and the KV cache read.

    python -m pytest -q tests/bench/test_static_engine_bench.py
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from search_rl.models import build_tiny_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"\d+(?:\.\d+)?"
LINE = re.compile(
    rf"^static_engine_bench engine=(?P<engine>\S+) arch=tiny case=(?P<case>plain|search-r1)(?: turn=(?P<turn>[12]))? "
    rf"seqs=2 max_batch=\d+ prompt_tokens=\d+ new_tokens=\d+ prefill_tok_s=(?P<prefill>{NUMBER}) "
    rf"decode_tok_s=(?P<decode>{NUMBER}|na) tok_s=(?P<tok>{NUMBER}) first_s={NUMBER} "
    rf"roofline=(?P<roofline>{NUMBER}|na) reused_tokens=(?P<reused>\d+) dtype=float32 device=cpu "
    r"commit=(?P<commit>\S+) torch=\S+ transformers=\S+$"
)


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))  # the bench imports gpu_check's shapes from its folder
    return load_bench("static_engine_bench")


@pytest.fixture
def run_bench(bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run the bench's ``main`` here (one torch thread: on shared cores a second one waits on the first) and parse
    its lines."""

    def run(*args: str) -> list[re.Match[str]]:
        argv = ["static_engine_bench.py", "--arch", "tiny", "--seqs", "2", "--bandwidth-gbs", "10", *args]
        monkeypatch.setattr(sys, "argv", argv)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            bench.main()
        finally:
            torch.set_num_threads(threads)
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("static_engine_bench ")]
        matches = [LINE.match(line) for line in lines]
        assert lines and all(matches), lines
        return [m for m in matches if m is not None]

    return run


def test_plain_lines_time_fresh_prompts_unless_reuse_is_asked(run_bench) -> None:
    fresh = run_bench("--prompt-tokens", "24", "--new-tokens", "6", "--engines", "hf", "static")
    assert [m["engine"] for m in fresh] == ["hf", "static"]
    for m in fresh:
        assert float(m["prefill"]) > 0 and float(m["tok"]) > 0 and m["reused"] == "0"
        assert m["commit"] != "unknown"  # the tests run in a git checkout
    reused = run_bench("--prompt-tokens", "24", "--new-tokens", "6", "--engines", "static", "--reuse")
    assert int(reused[0]["reused"]) > 0  # the timed calls took the warm-up call's states


def test_search_r1_case_reuses_the_first_turn_in_the_second(run_bench) -> None:
    turns = run_bench("--case", "search-r1", "--engines", "static")
    assert [(m["case"], m["turn"]) for m in turns] == [("search-r1", "1"), ("search-r1", "2")]
    first, second = turns
    assert first["reused"] == "0"
    assert int(second["reused"]) >= 2 * 270  # at least each prompt of the first turn (270-330 tokens)
    assert float(second["tok"]) > 0


def test_decode_bytes_are_the_weights_and_the_kv_cache_read(bench: ModuleType) -> None:
    model = build_tiny_model(load_tokenizer(), seed=0)
    cfg = model.config
    weights = sum(p.numel() * 4 for p in model.parameters())
    if not cfg.tie_word_embeddings:  # a decode step reads a few rows of an untied input embedding
        weights -= model.get_input_embeddings().weight.numel() * 4
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # keys and values, float32
    assert bench.decode_bytes(model, 1, 0) == weights
    assert bench.decode_bytes(model, 8, 100.0) == weights + 8 * 100 * kv_per_token
