"""Tools declared in config, in the chat-template format, through the entry points: one GRPO step of ``main_ppo``
(in-process workers) and ``main_eval``, a tiny model whose tokenizer carries Qwen2.5's tool template, the example
``glossary`` tool beside ``search`` against a real retriever.

Proves: the prompts the entry points build list both tools (the scripted engine knows only those prompts, so a prompt
without them fails the run); the custom tool is called from config and its answer reaches the model; the trained
mask covers the model's own tokens only, not either tool's output; a malformed call is an observation and counted;
the records name each call's tool. The model's turns are forced by a logits processor (``ScriptedLogits``): a random
model would never write a call.

Run: python -m pytest tests/search_rl/rollout/tools/test_tools_in_entry_points.py -q
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from scripted_logits import ScriptedLogits

from search_rl.configure import load_config
from search_rl.evaluation.run import evaluate, load_eval_config
from search_rl.main_ppo import build_trainer, build_workers, prepare
from search_rl.models.tiny import build_tiny_model
from search_rl.prompt_data import encode_prompt
from search_rl.rollout.engines.hf import HFEngine
from search_rl.rollout.tools import prompt_tools
from search_rl.templates import load_template, render_prompt
from search_rl.tracking.jsonl import read_jsonl

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
GLOSSARY = (
    "{name: glossary, entry_point: 'search_rl.rollout.tools.example:Glossary', "
    "settings: {entries: {RL: reinforcement learning}}}"
)
CHAT_TOOLS = ["actor_rollout_ref.rollout.action_format=chat_template", f"actor_rollout_ref.rollout.tools=[{GLOSSARY}]"]
BUDGETS = [
    "max_turns=2",
    "actor_rollout_ref.rollout.max_turn_tokens=128",
    "actor_rollout_ref.rollout.max_obs_tokens=96",
]


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, qwen_tokenizer) -> Path:
    """The tiny random Llama saved as an HF folder with the tool-rendering template."""
    d = tmp_path_factory.mktemp("tiny-qwen-template")
    build_tiny_model(qwen_tokenizer, seed=0).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """Two shipped training questions with the shipped ``tool_call`` prompt."""
    d = pd.read_parquet(REPO / "data/datasets/nq_hotpotqa_mini/train.parquet").head(2).copy()
    template = load_template("tool_call")
    d["prompt"] = [[{"role": "user", "content": render_prompt(template, q)}] for q in d["question"]]
    path = tmp_path_factory.mktemp("rows") / "rows.parquet"
    d.to_parquet(path, index=False)
    return path, d


def _gold(frame: pd.DataFrame) -> str:
    """The first row's first gold answer."""
    return str(frame["reward_model"].iloc[0]["ground_truth"]["target"][0])


def _script(frame: pd.DataFrame, tokenizer, rollout) -> dict[tuple[int, ...], list[str]]:
    """Row 0 calls both tools and answers right; row 1 adds a call of a tool that does not exist, and answers wrong."""
    schemas = prompt_tools(rollout, tokenizer)
    assert schemas is not None and [s["function"]["name"] for s in schemas] == ["search", "glossary"]
    scripts = {}
    for i, (messages, question) in enumerate(zip(frame["prompt"], frame["question"], strict=True)):
        first = "<think>Look it up.</think>" + call("glossary", term="RL") + call("search", query=question)
        if i == 1:
            first += call("calculator", x=1)
        answer = f"<answer> {_gold(frame) if i == 0 else 'nobody'} </answer>"
        scripts[tuple(encode_prompt(tokenizer, list(messages), schemas))] = [first, answer]
    return scripts


@pytest.fixture
def scripted_engines(monkeypatch):
    """Every rollout the entry points assemble generates through ``ScriptedLogits`` over its own model."""
    scripts: dict[tuple[int, ...], list[str]] = {}

    def build_engine(cfg, tokenizer, *, model, export, device, seed, name="policy"):
        return HFEngine(model, tokenizer, logits_processor=ScriptedLogits(tokenizer, scripts))

    monkeypatch.setattr("search_rl.rollout.assembly.build_engine", build_engine)
    return scripts


def _check_records(records: list[dict], gold: str) -> None:
    for r in records:
        assert '"name": "glossary"' in r["prompt"] and '"name": "search"' in r["prompt"], "the prompt lists both tools"
        assert [c.get("tool", "search") for c in r["search_calls"]] == ["glossary", "search"]
        observations = [s for s in r["segments"] if s["kind"] == "observation"]
        assert "RL: reinforcement learning" in observations[0]["text"] and "Doc 1(Title:" in observations[0]["text"]
        trained = {t for start, end in r["mask_spans"] for t in range(start, end)}
        model = {t for s in r["segments"] if s["kind"] == "model" for t in range(s["start"], s["end"])}
        assert trained == model, "the mask covers the model's tokens and neither tool's output"
    assert "unknown tool 'calculator'" in [s for s in records[1]["segments"] if s["kind"] == "observation"][0]["text"]
    assert records[0]["answer"] == gold and records[0]["reward_components"]["em"] == 1.0


def test_a_config_tool_trains_in_main_ppo(retriever_url, model_dir, rows, qwen_tokenizer, scripted_engines, tmp_path):
    path, frame = rows
    cfg = load_config(
        [
            f"model.path={model_dir}",
            "algorithm=grpo",
            "algorithm.adv_estimator=reinforce_plus_plus",  # one sample per question: the script is per prompt
            f"retriever.url={retriever_url}",
            *BUDGETS,
            *CHAT_TOOLS,
            f"data.train_files=[{path}]",
            "trainer.logger=[]",
            "trainer.torch_threads_per_worker=1",
            "trainer.total_training_steps=1",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "data.train_batch_size=2",
            "data.shuffle=false",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.max_response_tokens=400",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    scripted_engines.update(_script(frame, qwen_tokenizer, cfg.actor_rollout_ref.rollout.search_loop_config()))
    actor, critic = build_workers(cfg, "cpu", local=True)
    m = dict(build_trainer(cfg, prepare(cfg), actor, critic).fit())[1]
    assert math.isfinite(m["actor/loss"])
    assert m["rollout/tool_calls"] == 5 and m["rollout/tool_errors"] == 1
    (dump,) = tmp_path.rglob("rollouts/train_step_000001.jsonl")
    records = sorted((json.loads(line) for line in dump.read_text().splitlines()), key=lambda r: r["row_index"])
    _check_records(records, _gold(frame))


def test_a_config_tool_runs_in_main_eval(retriever_url, model_dir, rows, qwen_tokenizer, scripted_engines, tmp_path):
    path, frame = rows
    cfg = load_eval_config(
        [
            f"model.path={model_dir}",
            f"retriever.url={retriever_url}",
            *BUDGETS,
            *CHAT_TOOLS,
            f"data.files=[{path}]",
            f"output_dir={tmp_path}",
        ]
    )
    scripted_engines.update(_script(frame, qwen_tokenizer, cfg.rollout))
    result = evaluate(cfg)
    records = sorted(read_jsonl(result.output_dir / "trajectories.jsonl"), key=lambda r: r["row_index"])
    _check_records(records, _gold(frame))
    assert result.metrics["eval/all/em"] == 0.5
