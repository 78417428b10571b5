"""Rollouts while a real retriever server is stopped, or stopped and restarted, between two turns.

Each test starts its own ``uvicorn retriever_server.app:app`` (BM25 over the shipped corpus, index cached for the
module) and kills or restarts it from inside the rollout, right after the engine's first turn. Nothing here depends
on how fast the machine is: the restart test gives the client as long to retry as the server has to become ready.

Run: python -m pytest tests/search_rl/rollout/test_retriever_failures.py -q
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from retriever_server.launcher import RetrieverProcess, bm25_env, free_port
from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.rollout.backends import RetrieverClient, RetrieverError
from search_rl.rollout.generation_manager import LLMGenerationManager
from search_rl.tags import RETRIEVER_ERROR_TEXT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = ["<search> Deadpool 2 </search>", "<search> Nobel Prize </search>", "<answer> x </answer>"]
READY_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def server_env(tmp_path_factory) -> dict[str, str]:
    return bm25_env(tmp_path_factory.mktemp("bm25-failures"))


@pytest.fixture
def server(server_env, tmp_path):
    proc = RetrieverProcess(
        env=server_env, port=free_port(), ready_timeout_s=READY_TIMEOUT_S, log_path=tmp_path / "server.log"
    )
    proc.start()
    yield proc
    proc.stop()


def _run(server, tokenizer, make_scripted_engine, make_prompt, after_call, on_error: str, **client_kw):
    prompts = [make_prompt("first"), make_prompt("second")]
    engine = make_scripted_engine({tuple(p): SCRIPT for p in prompts}, after_call=after_call)
    client_cfg = RetrieverClientConfig(url=server.url, **({"max_retries": 1, "backoff_s": 0.1} | client_kw))
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=32, max_obs_tokens=120, on_retriever_error=on_error)
    client = RetrieverClient(client_cfg)
    return LLMGenerationManager(engine, tokenizer, client, cfg).generate(prompts), client


def test_stopped_server_becomes_error_observations(server, tokenizer, make_scripted_engine, make_prompt):
    def stop_after_second_turn(n_calls: int) -> None:
        if n_calls == 2:
            server.stop()

    result, client = _run(server, tokenizer, make_scripted_engine, make_prompt, stop_after_second_turn, "observe")
    for traj in result.trajectories:
        obs = [s.text for s in traj.segments if s.kind == "observation"]
        assert len(obs) == 2 and "Deadpool" in obs[0] and RETRIEVER_ERROR_TEXT in obs[1]
        assert traj.stats.retriever_errors == 1 and traj.num_searches == 2
        assert traj.final_answer == "x", "the rollout goes on after the failure"
    assert result.metrics["rollout/retriever_errors"] == 2.0
    assert client.failures == 1 and client.retries == 1


def test_stopped_server_fails_the_step_naming_url_and_command(server, tokenizer, make_scripted_engine, make_prompt):
    def stop_after_first_turn(n_calls: int) -> None:
        if n_calls == 1:
            server.stop()

    with pytest.raises(RetrieverError) as info:
        _run(server, tokenizer, make_scripted_engine, make_prompt, stop_after_first_turn, "raise")
    assert server.url in str(info.value) and "uvicorn retriever_server.app:app" in str(info.value)


def test_restarted_server_is_reached_by_retries(server, tokenizer, make_scripted_engine, make_prompt):
    """The server goes down before the first search and comes back only after the client has seen it fail; the
    client's retries (0.5 s apart) last as long as the server is given to become ready, however slow the machine."""
    restart_errors: list[BaseException] = []
    restarted = threading.Event()
    clients = []

    def restart_once_the_client_failed() -> None:
        try:
            while clients[0].retries == 0:  # the first attempt must meet the stopped server
                time.sleep(0.05)
            server.start()  # blocks until /health says ready
            restarted.set()
        except BaseException as e:  # reported by the assertion below
            restart_errors.append(e)

    def restart_after_first_turn(n_calls: int) -> None:
        if n_calls == 1:
            server.stop()
            threading.Thread(target=restart_once_the_client_failed, daemon=True).start()

    backoff_max_s = 0.5
    retries = math.ceil(READY_TIMEOUT_S / backoff_max_s) + 10
    prompts = [make_prompt("first"), make_prompt("second")]
    engine = make_scripted_engine({tuple(p): SCRIPT for p in prompts}, after_call=restart_after_first_turn)
    client = RetrieverClient(
        RetrieverClientConfig(url=server.url, max_retries=retries, backoff_s=0.1, backoff_max_s=backoff_max_s)
    )
    clients.append(client)
    cfg = RolloutConfig(search_turns=3, max_turn_tokens=32, max_obs_tokens=120, on_retriever_error="raise")
    result = LLMGenerationManager(engine, tokenizer, client, cfg).generate(prompts)
    # the client may reach the server before start() has polled /health and returned: wait for the restart thread
    restarted.wait(timeout=READY_TIMEOUT_S)
    assert not restart_errors, f"the server did not come back: {restart_errors[0]!r}"
    assert restarted.is_set() and client.retries >= 1 and client.failures == 0
    for traj in result.trajectories:
        obs = [s.text for s in traj.segments if s.kind == "observation"]
        assert "Deadpool" in obs[0] and "Nobel" in obs[1] and traj.stats.retriever_errors == 0
