"""bench/gpu_gates.py, the checks gpu_check exits non-zero on: the log-prob bound (the static engine's replay bound in
bf16), the lever gate, the graph-replay check run on CPU through a stand-in graph (passing, and failing on a replay
that differs), the record of checks, and the ``gpu`` tests run where CUDA is absent.

    python -m pytest -q tests/bench/test_gpu_gates.py
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from search_rl.datatypes import Generated
from search_rl.models import build_tiny_model, load_tokenizer
from search_rl.rollout.engines.step_graphs import mismatch_bound

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gates(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("gpu_gates")


@pytest.fixture(scope="module")
def levers(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("update_levers")


@pytest.mark.parametrize("layers", [2, 30, 36])
def test_the_bf16_logprob_bound_is_the_replay_bound(gates: ModuleType, layers: int) -> None:
    assert gates.logprob_bound("bfloat16", layers) == pytest.approx(mismatch_bound(torch.bfloat16, layers))
    with pytest.raises(ValueError, match="float16"):
        gates.logprob_bound("float16", layers)


def test_logprob_check_fails_a_step_past_the_bound(gates: ModuleType) -> None:
    bound = gates.logprob_bound("bfloat16", 30)
    ok = [{"rollout/logprob_abs_diff": 0.0045}, {"rollout/logprob_abs_diff": 0.9 * bound}]
    assert "0.0045" in gates.check_logprobs(ok, "bfloat16", 30)
    with pytest.raises(gates.CheckFailed, match="bound"):
        gates.check_logprobs([*ok, {"rollout/logprob_abs_diff": 1.1 * bound}], "bfloat16", 30)
    with pytest.raises(gates.CheckFailed, match="not recomputed"):
        gates.check_logprobs([{"timing/step_s": 1.0}], "bfloat16", 30)


def _row(levers: ModuleType, name: str, loss: float, grad_norm: float, weights: float) -> object:
    return levers.LeverRow(name, 1.0, 1.0, 1.0, 100.0, loss, grad_norm, 1.0, weights)


def test_lever_gate_allows_rounding_and_names_a_lever_that_moves_the_update(
    gates: ModuleType, levers: ModuleType
) -> None:
    off = _row(levers, "off", 0.5, 4.8, 1234.5)
    rounding = _row(levers, "chunked log-probs", 0.5, 4.8 * (1 + 3e-4), 1234.5)  # the 3B run's gradient-norm spread
    assert "1 settings" in gates.check_levers([off, rounding], "bfloat16")
    near_zero = [_row(levers, "off", 4.5e-6, 4.8, 1234.5), _row(levers, "sorted", 4.6e-6, 4.8, 1234.5)]
    assert gates.check_levers(near_zero, "float32")  # a loss near 0 is compared at the scale of its terms (~1)
    with pytest.raises(gates.CheckFailed, match="chunked log-probs: grad_norm"):
        gates.check_levers([off, rounding], "float32")  # 3e-4 is past float32's tolerance
    dropped = _row(levers, "token budgets", 0.5 * 0.75, 4.8, 1234.5)  # a micro-batch of four left out
    moved = _row(levers, "all on", 0.5, 4.8, 1234.5 * (1 + 1e-9))
    with pytest.raises(gates.CheckFailed) as failed:
        gates.check_levers([off, rounding, dropped, moved], "bfloat16")
    assert "token budgets: loss" in str(failed.value) and "all on: weights_norm" in str(failed.value)
    assert "chunked" not in str(failed.value).split("[")[0]


def test_checks_run_on_after_a_failure_and_exit_naming_it(gates: ModuleType, capsys: pytest.CaptureFixture) -> None:
    checks = gates.Checks()

    def fails() -> str:
        raise gates.CheckFailed("off by 2")

    def crashes() -> str:
        raise RuntimeError("boom")

    assert checks.run("a", lambda: "fine") and not checks.run("b", fails) and not checks.run("c", crashes)
    out = capsys.readouterr().out
    assert "check a ok fine" in out and "check b FAILED off by 2" in out and "check c FAILED crashed" in out
    with pytest.raises(SystemExit, match="gpu_check FAILED b c"):
        checks.exit_if_failed()
    gates.Checks().exit_if_failed()  # nothing failed: returns


def _gen(tokens: list[int], logprobs: list[float]) -> Generated:
    return Generated(tuple(tokens), "length", None, tuple(logprobs))


def test_greedy_outputs_may_part_only_at_a_near_tie(gates: ModuleType) -> None:
    same = _gen([1, 2, 3], [-1.0, -2.0, -3.0])
    tie = _gen([1, 2, 4], [-1.0, -2.0, -3.0 + 1e-3])
    wrong = _gen([1, 5, 6], [-1.0, -0.5, -0.1])
    drifted = _gen([1, 2, 3], [-1.0, -2.5, -3.0])
    assert gates.compare_greedy([same, same], [same, tie], 0.04)[:2] == (1, 1)
    assert gates.compare_greedy([same], [tie], 0.04)[3] == []
    assert "row 0 differs at token 1" in gates.compare_greedy([same], [wrong], 0.04)[3][0]
    assert "log-probs before" in gates.compare_greedy([same], [drifted], 0.04)[3][-1]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = load_tokenizer()
    folder = tmp_path_factory.mktemp("tiny")
    build_tiny_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def one_thread():
    """One torch thread: on shared cores a second one waits on the first at every small op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_graph_replay_check_passes_the_engine_on_cpu(gates: ModuleType, tiny_folder: Path) -> None:
    seen = gates.check_graph_replay(tiny_folder, "cpu", rows=4, new_tokens=8)
    assert "12/12 rows identical" in seen and "fallbacks 0" in seen and "captures 0" not in seen


@pytest.mark.usefixtures("one_thread")
def test_graph_replay_check_fails_a_replay_that_differs(gates: ModuleType, tiny_folder: Path) -> None:
    class Corrupt(gates.ReplayStandIn):
        def replay(self) -> None:
            self.out.copy_(self.fn() + 1.0)  # a replay that read stale inputs

    with pytest.raises(gates.CheckFailed, match="fell back to eager"):
        gates.check_graph_replay(tiny_folder, "cpu", rows=4, new_tokens=8, graph_factory=Corrupt)


@pytest.mark.integration  # runs pytest in a child process
def test_gpu_tests_are_found_and_skipped_without_cuda(gates: ModuleType) -> None:
    files = {p.name for p in gates.gpu_test_files(REPO)}
    assert {"test_gpu.py", "test_static_engine.py"} <= files
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the gpu tests would run, not be skipped")
    seen = gates.check_gpu_tests(REPO, "cpu", timeout_s=300)
    assert "skipped" in seen and "failed" not in seen
