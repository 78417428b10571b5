"""Rollouts while a real retriever server is stopped, or stopped and restarted, between two turns.

Each test starts its own ``uvicorn retriever_server.app:app`` (BM25 over the shipped corpus, index cached for the
module) and kills or restarts it from inside the rollout, right after the engine's first turn.

Run: python -m pytest tests/search_rl/agent/test_retriever_failures.py -q
"""

from __future__ import annotations

import threading

import pytest

from retriever_server.launcher import RetrieverProcess, free_port
from search_rl.agent.generation_manager import LLMGenerationManager
from search_rl.agent.retriever_client import RetrieverClient, RetrieverError
from search_rl.config import RetrieverClientConfig, RolloutConfig
from search_rl.tags import RETRIEVER_ERROR_TEXT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = ["<search> Deadpool 2 </search>", "<search> Nobel Prize </search>", "<answer> x </answer>"]


@pytest.fixture(scope="module")
def server_env(tmp_path_factory) -> dict[str, str]:
    return {
        "RETRIEVER_METHOD": "bm25",
        "RETRIEVER_INDEX_DIR": str(tmp_path_factory.mktemp("bm25-failures")),
        "RETRIEVER_SHOW_PROGRESS": "false",
    }


@pytest.fixture
def server(server_env, tmp_path):
    proc = RetrieverProcess(env=server_env, port=free_port(), ready_timeout_s=180, log_path=tmp_path / "server.log")
    proc.start()
    yield proc
    proc.stop()


def _run(server, tokenizer, make_scripted_engine, make_prompt, after_call, on_error: str, **client_kw):
    prompts = [make_prompt("first"), make_prompt("second")]
    engine = make_scripted_engine({tuple(p): SCRIPT for p in prompts}, after_call=after_call)
    client_cfg = RetrieverClientConfig(url=server.url, **({"max_retries": 1, "backoff_s": 0.1} | client_kw))
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=32, max_obs_tokens=120, on_retriever_error=on_error)
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
    restarted = threading.Event()

    def restart_after_first_turn(n_calls: int) -> None:
        if n_calls == 1:
            server.stop()
            threading.Thread(target=lambda: (server.start(), restarted.set()), daemon=True).start()

    result, client = _run(
        server,
        tokenizer,
        make_scripted_engine,
        make_prompt,
        restart_after_first_turn,
        "raise",
        max_retries=8,
        backoff_s=0.5,
        backoff_max_s=4.0,
    )
    assert restarted.is_set() and client.retries >= 1 and client.failures == 0
    for traj in result.trajectories:
        obs = [s.text for s in traj.segments if s.kind == "observation"]
        assert "Deadpool" in obs[0] and "Nobel" in obs[1] and traj.stats.retriever_errors == 0
