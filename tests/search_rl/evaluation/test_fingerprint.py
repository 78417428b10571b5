"""Pinned evaluation: the fingerprint ``main_eval`` writes, and ``compare_evals`` refusing rows made differently
(another corpus, top-k, template, the static engine's graphs or compile) with the difference named, unless it is
declared intended.

Run: python -m pytest tests/search_rl/evaluation/test_fingerprint.py -q
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from search_rl import configure
from search_rl.evaluation.comparisons import check_comparable, differences
from search_rl.evaluation.fingerprint import (
    build_fingerprint,
    describe_retriever,
    engine_identity,
    engine_settings,
    pin,
    prompts_sha256,
    rollout_settings,
    weights_sha256,
)
from search_rl.main_eval import load_eval_config
from search_rl.models import compute_dtype, load_model, load_tokenizer
from search_rl.rollout.backends.http import HttpBackend
from search_rl.rollout.engines.hf import HFEngine
from search_rl.tools.compare_evals import main

HEALTH = {"backend": "http", "method": "dense", "num_documents": 16430, "index_path": "dense-afcf313a60db4ca3"}


ENGINE = {"name": "hf", "dtype": "float32"}
ROLLOUT = "actor_rollout_ref.rollout"


def fingerprint(
    *overrides: str, retriever: dict | None = None, prompts: str = "p1", engine: dict | None = None
) -> dict:
    cfg = load_eval_config(list(overrides))
    return build_fingerprint(
        cfg,
        weights="w1",
        prompts=prompts,
        data_files=cfg.data.files,
        retriever=HEALTH if retriever is None else retriever,
        engine=ENGINE if engine is None else engine,
    )


def test_fingerprint_pins_what_decides_the_numbers():
    fp = fingerprint("retriever.topk=5", "max_turns=2")
    assert fp["retriever"] == {**HEALTH, "topk": 5}
    assert fp["budgets"]["max_turns"] == 2 and fp["budgets"]["decoding"] == "greedy"
    assert (
        fp["data"]["files"]["test.parquet"]
        == json.loads(Path("data/datasets/MANIFEST.json").read_text())["files"]["nq_hotpotqa_mini/test.parquet"][
            "sha256"
        ]
    )
    assert {"python", "torch", "transformers"} <= set(fp["packages"])
    assert fp["model"]["weights_sha256"] == "w1" and fp["template"]["prompts_sha256"] == "p1"


def test_weights_and_prompt_hashes_see_one_changed_value():
    a = torch.nn.Linear(3, 2)
    before = weights_sha256(a)
    with torch.no_grad():
        a.weight[0, 0] += 1e-6
    assert weights_sha256(a) != before
    assert prompts_sha256([[1, 2, 3]]) != prompts_sha256([[1, 2, 4]])


def test_differences_are_named_and_refused_unless_intended():
    base = fingerprint()
    other_topk = fingerprint("retriever.topk=5")
    assert differences([base, other_topk]) == {"retriever.topk": [3, 5]}
    with pytest.raises(ValueError, match=r"retriever.topk: a=3, b=5[\s\S]*--allow retriever"):
        check_comparable(["a", "b"], [base, other_topk])
    assert check_comparable(["a", "b"], [base, other_topk], allow=["retriever.topk"]) == ["retriever.topk: a=3, b=5"]
    other_model = copy.deepcopy(base)
    other_model["model"]["weights_sha256"] = "w2"
    assert check_comparable(["a", "b"], [base, other_model]) == ["model.weights_sha256: a=w1, b=w2"]
    with pytest.raises(ValueError, match=r"b: no fingerprint \(to compare it unchecked: --allow fingerprint\)"):
        check_comparable(["a", "b"], [base, None])
    assert check_comparable(["a", "b"], [base, None], allow=["fingerprint"]) == [
        "b: no fingerprint: not checked (--allow fingerprint)"
    ]


def write_eval(folder: Path, fp: dict) -> Path:
    folder.mkdir(parents=True)
    metrics = {"model": "m", "eval/all/em": 0.5, "eval/all/n": 2.0, "fingerprint": fp}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    lines = [json.dumps({"uid": u, "reward_components": {"em": v}}) for u, v in (("q1", 1.0), ("q2", 0.0))]
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"retriever": {**HEALTH, "index_path": "dense-0123456789abcdef"}}, "retriever.index_path"),
        ({"overrides": ["retriever.topk=5"]}, "retriever.topk: base=3, other=5"),
        ({"overrides": ["baseline=no_search"], "prompts": "p2"}, "template.baseline: base=search, other=no_search"),
        ({"retriever": {**HEALTH, "index_key": "dense-ivf"}}, "retriever.index_key: base=<absent>, other=dense-ivf"),
        ({"retriever": {**HEALTH, "search_settings.nprobe": 64}}, "retriever.search_settings.nprobe"),
        ({"engine": {"name": "vllm", "dtype": "float32"}}, "engine.name: base=hf, other=vllm"),
        ({"engine": {"name": "hf", "dtype": "bfloat16"}}, "engine.dtype: base=float32, other=bfloat16"),
        ({"overrides": [f"{ROLLOUT}.schedule=continuous"]}, "rollout.schedule: base=turns, other=continuous"),
        ({"overrides": [f"{ROLLOUT}.hf.prefix_cache=false"]}, "engine.hf.prefix_cache: base=True, other=False"),
        ({"overrides": [f"{ROLLOUT}.hf.max_batch_size=8"]}, "engine.hf.max_batch_size: base=64, other=8"),
        ({"overrides": ["batch_size=8"]}, "rollout.batch_size: base=32, other=8"),
    ],
    ids=["corpus", "topk", "template", "index", "nprobe", "engine", "dtype", "schedule", "prefix", "micro", "batch"],
)
def test_compare_evals_refuses_a_mismatch(change, named, tmp_path, capsys):
    base = write_eval(tmp_path / "base", fingerprint())
    other_fp = fingerprint(
        *change.get("overrides", []),
        retriever=change.get("retriever"),
        prompts=change.get("prompts", "p1"),
        engine=change.get("engine"),
    )
    other = write_eval(tmp_path / "other", other_fp)
    assert main([f"base={base}", f"other={other}"]) == 2
    err = capsys.readouterr().err
    assert "not made the same way" in err and named in err
    section = named.split(".")[0]
    assert main([f"base={base}", f"other={other}", "--allow", section]) == 0
    out = capsys.readouterr().out
    assert "| base | 0.500 |" in out and "Differences in how the rows were made (intended):" in out and named in out


def test_an_older_result_without_the_rollout_section_is_read_and_refused_unless_named(tmp_path, capsys):
    old = fingerprint()
    del old["rollout"]  # written before the rollout settings were recorded
    base = write_eval(tmp_path / "old", old)
    other = write_eval(tmp_path / "new", fingerprint())
    assert main([f"old={base}", f"new={other}"]) == 2
    err = capsys.readouterr().err
    assert "rollout.schedule: old=<absent>, new=turns" in err and "what it ran with is unknown" in err
    assert main([f"old={base}", f"new={other}", "--allow", "rollout"]) == 0
    assert check_comparable(["a", "b"], [old, copy.deepcopy(old)]) == [], "a key both lack is not compared"


def test_only_the_settings_of_the_engine_that_ran_are_pinned():
    cfg = load_eval_config([f"{ROLLOUT}.hf.prefix_cache=false", f"{ROLLOUT}.vllm.enforce_eager=false"])
    static = fingerprint(engine={"name": "static", "dtype": "float32"})["engine"]
    assert static["hf"] == {"max_batch_size": 64, "prefix_cache": True} and "vllm" not in static
    assert engine_settings(cfg, "hf")["hf"]["prefix_cache"] is False
    vllm = engine_settings(cfg, "vllm")
    assert vllm["vllm"]["enforce_eager"] is False and vllm["gpu_memory_utilization"] == 0.9 and "hf" not in vllm
    assert rollout_settings(cfg, schedule="turns")["schedule"] == "turns"


def test_a_retriever_without_health_leaves_the_gap_visible():
    cfg = load_eval_config(["retriever.url=http://127.0.0.1:9"])  # nothing listens on the discard port
    desc = describe_retriever(cfg, object())
    assert desc is not None and desc["backend"] == "http" and "gave no description" in desc["unpinned"]

    class Backend:
        def fingerprint(self) -> dict:
            return {"backend": "web", "provider": "serper", "country": "us"}

    assert describe_retriever(cfg, Backend()) == {"backend": "web", "provider": "serper", "country": "us"}
    assert describe_retriever(cfg, None) is None


@pytest.fixture
def health_server() -> Iterator[tuple[str, dict]]:
    """A server whose ``GET /health`` answers the dict the test fills (what a retriever reports)."""
    body: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", body
    server.shutdown()


def test_the_retrievers_corpus_index_and_search_settings_are_pinned(health_server):
    url, body = health_server
    cfg = load_eval_config([f"retriever.url={url}"])

    def described(**health: object) -> dict:
        body.clear()
        body.update({"status": "ready", "method": "dense", "num_documents": 100, **health})
        return describe_retriever(cfg, HttpBackend(cfg.retriever)) or {}

    ivf = described(
        corpus_sha256="c" * 64,
        index_key="dense-ivf1",
        search_settings={"nprobe": 16, "query_prefix": "query: ", "ef_search": None},
    )
    assert ivf["corpus_sha256"] == "c" * 64 and ivf["index_key"] == "dense-ivf1"
    assert ivf["search_settings.nprobe"] == "16" and ivf["search_settings.query_prefix"] == "query: "
    assert "search_settings.ef_search" not in ivf and "status" not in ivf  # null settings and state stay out
    assert not {"corpus_sha256", "index_key"} & described(corpus_sha256=None).keys()  # absent ones stay absent

    def refused_key(**health: object) -> str:
        a = fingerprint(retriever=ivf)
        b = fingerprint(retriever=described(**health))
        with pytest.raises(ValueError, match="not made the same way") as e:
            check_comparable(["a", "b"], [a, b])
        return str(e.value)

    kept = {"corpus_sha256": "c" * 64, "index_key": "dense-ivf1"}
    assert "retriever.search_settings.nprobe: a=16, b=64" in refused_key(
        **kept, search_settings={"nprobe": 64, "query_prefix": "query: "}
    )
    assert "retriever.index_key: a=dense-ivf1, b=dense-hnsw1" in refused_key(
        **{**kept, "index_key": "dense-hnsw1"}, search_settings={"nprobe": 16, "query_prefix": "query: "}
    )


def test_the_engine_and_the_dtype_it_ran_in_are_pinned(tokenizer):
    cfg = load_eval_config(["model=tiny", "model.dtype=float32"])
    engine = HFEngine(load_model("tiny", dtype=torch.bfloat16), tokenizer)
    fp = pin(cfg, engine.model, engine, [[1, 2]], None)
    assert (fp["engine"]["name"], fp["engine"]["dtype"]) == ("hf", "bfloat16")  # what ran, not what was asked
    assert fp["engine"]["dtype_reason"] == (
        "the engine loaded the weights in their saved dtype; model.dtype=float32 (model.dtype=float32 set in the "
        "config) did not apply"
    )
    assert "dtype" not in fp["model"]
    assert engine_identity(HFEngine(load_model("tiny"), load_tokenizer("tiny"))) == {"name": "hf", "dtype": "float32"}


def test_the_schedule_that_ran_is_pinned_not_the_one_asked_for(tokenizer, monkeypatch):
    cfg = load_eval_config(["model=tiny", f"{ROLLOUT}.engine=hf", f"{ROLLOUT}.schedule=continuous"])
    engine = HFEngine(load_model("tiny"), tokenizer)
    assert pin(cfg, engine.model, engine, [[1, 2]], None)["rollout"]["schedule"] == "continuous"
    monkeypatch.setattr(HFEngine, "supports_sessions", property(lambda self: False))  # e.g. a sliding-window cache
    assert pin(cfg, engine.model, engine, [[1, 2]], None)["rollout"]["schedule"] == "turns"


def test_the_compute_dtype_auto_chose_is_pinned_with_why_and_only_the_dtype_is_compared(tokenizer, monkeypatch):
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16", "amx_tile"}))
    monkeypatch.setattr(configure, "_cuda", lambda: False)
    bf16 = HFEngine(load_model("tiny", dtype=torch.bfloat16), tokenizer)
    fps = {}
    for name, dtype in (("auto", "auto"), ("named", "bfloat16")):
        cfg = load_eval_config(["model=tiny", f"model.dtype={dtype}"])
        assert cfg.model.dtype == "bfloat16"  # auto on an AMX CPU
        fps[name] = pin(cfg, bf16.model, bf16, [[1, 2]], None)
    assert fps["auto"]["engine"]["dtype"] == "bfloat16"
    assert fps["auto"]["engine"]["dtype_reason"].startswith("CPU has AMX: amx_bf16 and amx_tile flags")
    assert fps["named"]["engine"]["dtype_reason"] == "model.dtype=bfloat16 set in the config"
    assert check_comparable(["auto", "named"], [fps["auto"], fps["named"]]) == []  # the same dtype, another reason
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda: frozenset({"avx2"}))
    cfg = load_eval_config(["model=tiny"])
    fp32 = HFEngine(load_model("tiny", dtype=torch.float32), tokenizer)
    fps["avx2"] = pin(cfg, fp32.model, fp32, [[1, 2]], None)
    with pytest.raises(ValueError, match=r"engine\.dtype: auto=bfloat16, avx2=float32\n.*--allow engine"):
        check_comparable(["auto", "avx2"], [fps["auto"], fps["avx2"]])


def test_the_static_engines_graphs_and_compile_are_pinned_and_refused_when_they_differ(
    tokenizer, tmp_path, capsys, monkeypatch
):
    """Captured steps and compiled kernels change bf16 rounding, hence seeded samples: the fingerprint records what
    the static engine was built with (``rollout.static.*`` resolved for its device) and the calls that fell back,
    and ``compare_evals`` refuses rows that differ in them unless named."""
    from search_rl.rollout.engines.factory import build_static_engine
    from search_rl.rollout.engines.static import StaticEngine

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the compiled decoder is built, never run
    cfg = load_eval_config(["model=tiny", f"{ROLLOUT}.engine=static"])
    model = load_model("tiny")
    r = cfg.rollout
    engines = {
        "eager": build_static_engine(r.hf, r.static, model, tokenizer),
        "compiled": build_static_engine(r.hf, dataclasses.replace(r.static, compile=True), model, tokenizer),
        "graphs": StaticEngine(model, tokenizer, r.hf, graph_factory=object),  # a stand-in: captures on CPU
    }
    fps = {name: pin(cfg, model, engine, [[1, 2]], None) for name, engine in engines.items()}
    assert fps["eager"]["engine"]["static"] == {"cuda_graphs": False, "compile": False, "fallbacks": 0}
    assert fps["graphs"]["engine"]["static"]["cuda_graphs"] is True
    base, other = write_eval(tmp_path / "eager", fps["eager"]), write_eval(tmp_path / "compiled", fps["compiled"])
    assert main([f"eager={base}", f"compiled={other}"]) == 2
    err = capsys.readouterr().err
    assert "not made the same way" in err and "engine.static.compile: eager=False, compiled=True" in err
    assert main([f"eager={base}", f"compiled={other}", "--allow", "engine.static.compile"]) == 0
    with pytest.raises(ValueError, match=r"engine\.static\.cuda_graphs: eager=False, graphs=True"):
        check_comparable(["eager", "graphs"], [fps["eager"], fps["graphs"]])
    engines["graphs"].fallbacks["mismatch"] += 1  # a call redone eagerly after a failed replay check
    fell_back = pin(cfg, model, engines["graphs"], [[1, 2]], None)
    with pytest.raises(ValueError, match=r"engine\.static\.fallbacks: clean=0, fell_back=1"):
        check_comparable(["clean", "fell_back"], [fps["graphs"], fell_back])
