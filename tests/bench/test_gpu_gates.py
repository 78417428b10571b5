"""bench/gpu_gates.py, the checks gpu_check exits non-zero on: the log-prob bound (the static engine's replay bound in
bf16, in units of the logits' RMS: it passes a bf16 decode of the tiny model at any logit scale and fails one that
drops the temperature), the lever gate (on numbers, and AdamW's first step checked on a real optimizer against steps
that are wrong), the graph-replay check run on CPU through a stand-in graph (passing, and failing on a replay that
differs), the record of checks, and the ``gpu`` tests run where CUDA is absent.

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
from search_rl.models.loading import CACHE_KWARG
from search_rl.rollout.engines.static.step_graphs import mismatch_bound

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gates(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("gpu_gates")


@pytest.fixture(scope="module")
def levers(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("update_levers")


@pytest.mark.parametrize("layers", [2, 30, 36])
def test_the_bf16_logprob_bound_is_the_replay_bound(gates: ModuleType, layers: int) -> None:
    bound = gates.logprob_bound("bfloat16", layers, 2.5)
    assert bound == pytest.approx(2.5 * mismatch_bound(torch.bfloat16, layers))
    with pytest.raises(ValueError, match="float16"):
        gates.logprob_bound("float16", layers, 1.0)


def test_logprob_check_fails_a_step_past_the_bound(gates: ModuleType) -> None:
    bound = gates.logprob_bound("bfloat16", 30, 0.48)
    ok = [{"rollout/logprob_abs_diff": 0.0045}, {"rollout/logprob_abs_diff": 0.9 * bound}]
    assert "0.0045" in gates.check_logprobs(ok, "bfloat16", 30, 0.48)
    with pytest.raises(gates.CheckFailed, match="bound"):
        gates.check_logprobs([*ok, {"rollout/logprob_abs_diff": 1.1 * bound}], "bfloat16", 30, 0.48)
    with pytest.raises(gates.CheckFailed, match="not recomputed"):
        gates.check_logprobs([{"timing/step_s": 1.0}], "bfloat16", 30, 0.48)


def _logit_folder(tiny_folder: Path, tmp_path: Path, scale: float) -> Path:
    """The tiny model with its final norm's weight times ``scale`` (logits ``scale`` times larger, as a trained
    model's are), saved with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    folder = tmp_path / f"logits-x{scale:g}"
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_folder).save_pretrained(folder)
    return folder


def _engine_vs_trainer(folder: Path, engine_temperature: float) -> float:
    """Mean |engine - trainer| log-prob of 63 tokens under the model in ``folder`` in bf16: the trainer's one pass
    over the sequence against an engine's decode, one token at a time over its KV cache, whose logits are divided by
    ``engine_temperature`` (the trainer's by 1)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    ids = torch.randint(100, 4000, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trainer = model(input_ids=ids).logits.float()[:, :-1]
        steps, cache = [], DynamicCache()
        for t in range(ids.shape[1] - 1):
            steps.append(model(input_ids=ids[:, t : t + 1], **{CACHE_KWARG: cache}, use_cache=True).logits.float())
        engine = torch.cat(steps, dim=1) / engine_temperature
    target = ids[:, 1:, None]
    diff = torch.log_softmax(engine, -1).gather(-1, target) - torch.log_softmax(trainer, -1).gather(-1, target)
    return float(diff.abs().mean())


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_logprob_gate_passes_bf16_decoding_at_any_logit_scale_and_fails_a_dropped_temperature(
    gates: ModuleType, tiny_folder: Path, tmp_path: Path, scale: float
) -> None:
    """A bf16 decode against a bf16 pass differs by rounding, in proportion to the logits: measured 2.0e-4 at the tiny
    model's logit RMS of 0.16 (bound 1.8e-3) and 6.0e-3 at 30x (RMS 4.8, a trained model's size; bound 0.053; 1.6e-2 on
    another sequence, past the fixed ``2 u sqrt(L)`` = 0.011 nats the gate had). An engine that leaves out the sampling
    temperature (0.7) is off by a good part of the logits' scale (0.059 and 13.9) and fails at either."""
    from transformers import AutoConfig

    folder = _logit_folder(tiny_folder, tmp_path, scale)
    layers = AutoConfig.from_pretrained(folder).num_hidden_layers
    rms = gates.logit_rms(folder, "cpu", "bfloat16")
    correct = _engine_vs_trainer(folder, 1.0)
    assert "bound" in gates.check_logprobs([{"rollout/logprob_abs_diff": correct}], "bfloat16", layers, rms)
    with pytest.raises(gates.CheckFailed, match="bound"):
        gates.check_logprobs([{"rollout/logprob_abs_diff": _engine_vs_trainer(folder, 0.7)}], "bfloat16", layers, rms)


def _row(levers: ModuleType, name: str, loss: float, grad_norm: float, excess: float = 0.5, steps: int = 1) -> object:
    return levers.LeverRow(name, 1.0, 1.0, 1.0, 100.0, loss, grad_norm, 1.0, excess, steps)


def test_lever_gate_allows_rounding_and_names_a_lever_that_moves_the_update(
    gates: ModuleType, levers: ModuleType
) -> None:
    off = _row(levers, "off", 0.5, 4.8)
    rounding = _row(levers, "chunked log-probs", 0.5, 4.8 * (1 + 3e-4))  # the 3B run's gradient-norm spread
    assert "1 settings" in gates.check_levers([off, rounding], "bfloat16")
    near_zero = [_row(levers, "off", 4.5e-6, 4.8), _row(levers, "sorted", 4.6e-6, 4.8)]
    assert gates.check_levers(near_zero, "float32")  # a loss near 0 is compared at the scale of its terms (~1)
    with pytest.raises(gates.CheckFailed, match="chunked log-probs: grad_norm"):
        gates.check_levers([off, rounding], "float32")  # 3e-4 is past float32's tolerance
    dropped = _row(levers, "token budgets", 0.5 * 0.75, 4.8)  # a micro-batch of four left out
    moved = _row(levers, "all on", 0.5, 4.8, excess=300.0)  # its step was not AdamW's for its gradient
    stepped = _row(levers, "sorted", 0.5, 4.8, steps=2)  # a step per micro-batch
    with pytest.raises(gates.CheckFailed) as failed:
        gates.check_levers([off, rounding, dropped, moved, stepped], "bfloat16")
    why = str(failed.value).split("[")[0]
    assert "token budgets: loss" in why and "all on: weights off AdamW's step" in why and "sorted: 2 optimizer" in why
    assert "chunked" not in why


def _adamw_step(lr: float, *, planted: str = "") -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(before, after, gradients) of one AdamW step (fresh, weight decay 0.01) on a small MLP, and with ``planted``
    the step made wrong: ``twice`` (stepped again, as a step per micro-batch does), ``lr`` (at twice the rate),
    ``skipped`` (no step), ``written`` (one weight moved by 1e-6 outside the optimizer)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2 * lr if planted == "lr" else lr, weight_decay=0.01)
    model(torch.randn(64, 16)).square().mean().backward()
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    if planted != "skipped":
        optimizer.step()
    if planted == "twice":
        optimizer.step()
    if planted == "written":
        with torch.no_grad():
            model[0].weight[3, 5] += 1e-6
    return before, [p.detach().clone() for p in model.parameters()], grads


@pytest.mark.parametrize("planted", ["twice", "lr", "skipped", "written"])
def test_adamw_step_check_passes_adamw_and_fails_a_wrong_step(gates: ModuleType, levers: ModuleType, planted: str):
    lr = levers.LEVER_LR
    assert gates.adamw_step_excess(*_adamw_step(lr), lr, 0.01) <= 1
    assert gates.adamw_step_excess(*_adamw_step(lr, planted=planted), lr, 0.01) > 10


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_levers_on_cpu_pass_and_a_lever_that_steps_at_another_rate_fails(
    gates: ModuleType, levers: ModuleType, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``update_levers`` on the tiny model: every row's step is AdamW's first for its gradient. The planted bug: the
    token-budget path steps at twice the rate; its loss and gradient norm (taken before the step) are the levers-off
    row's, so only the step check names it (and the row that turns every lever on)."""
    from search_rl.workers.optimization import TrainableModel

    plain = TrainableModel._mini_batch_step

    def doubled_under_a_budget(self, mini, loss_fn, micro, mode, scope=None, max_tokens=0):  # type: ignore[no-untyped-def]
        groups = self.optimizer.param_groups if max_tokens > 0 else []
        rates = [group["lr"] for group in groups]
        for group in groups:
            group["lr"] *= 2
        try:
            return plain(self, mini, loss_fn, micro, mode, scope, max_tokens)
        finally:
            for group, lr in zip(groups, rates, strict=True):
                group["lr"] = lr

    monkeypatch.setattr(TrainableModel, "_mini_batch_step", doubled_under_a_budget)
    rows = levers.compare_levers(tiny_folder, "cpu", prompts=2, samples=2, turn_tokens=16, micro=2)
    assert [r.optimizer_steps for r in rows] == [1] * 5
    with pytest.raises(gates.CheckFailed) as failed:
        gates.check_levers(rows, "float32")
    why = str(failed.value).split("[")[0]
    assert "token budgets: weights off AdamW's step" in why and "all on: weights off" in why, why
    assert "loss" not in why and "grad_norm" not in why and "chunked" not in why and "sorted" not in why, why
    assert gates.check_levers([r for r in rows if "budget" not in r.name and r.name != "all on"], "float32")


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
