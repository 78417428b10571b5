"""Pinned evaluation: the fingerprint ``main_eval`` writes, and ``compare_evals`` refusing rows made differently
(another corpus, top-k, template) with the difference named, unless it is declared intended.

Run: python -m pytest tests/search_rl/evaluation/test_fingerprint.py -q
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from search_rl.evaluation.comparisons import check_comparable, differences
from search_rl.evaluation.fingerprint import build_fingerprint, describe_retriever, prompts_sha256, weights_sha256
from search_rl.main_eval import load_eval_config
from search_rl.tools.compare_evals import main

HEALTH = {"backend": "http", "method": "dense", "num_documents": 16430, "index_path": "dense-afcf313a60db4ca3"}


def fingerprint(*overrides: str, retriever: dict | None = None, prompts: str = "p1") -> dict:
    cfg = load_eval_config(list(overrides))
    return build_fingerprint(
        cfg,
        weights="w1",
        prompts=prompts,
        data_files=cfg.data.files,
        retriever=HEALTH if retriever is None else retriever,
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
    assert check_comparable(["a", "b"], [base, None]) == ["not pinned (evaluated before fingerprints, not checked): b"]


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
    ],
    ids=["corpus", "topk", "template"],
)
def test_compare_evals_refuses_a_mismatch(change, named, tmp_path, capsys):
    base = write_eval(tmp_path / "base", fingerprint())
    other_fp = fingerprint(
        *change.get("overrides", []), retriever=change.get("retriever"), prompts=change.get("prompts", "p1")
    )
    other = write_eval(tmp_path / "other", other_fp)
    assert main([f"base={base}", f"other={other}"]) == 2
    err = capsys.readouterr().err
    assert "not made the same way" in err and named in err
    section = named.split(".")[0]
    assert main([f"base={base}", f"other={other}", "--allow", section]) == 0
    out = capsys.readouterr().out
    assert "| base | 0.500 |" in out and "Differences in how the rows were made (intended):" in out and named in out


def test_a_retriever_without_health_leaves_the_gap_visible():
    cfg = load_eval_config(["retriever.url=http://127.0.0.1:9"])  # nothing listens on the discard port
    desc = describe_retriever(cfg, object())
    assert desc is not None and desc["backend"] == "http" and "gave no description" in desc["unpinned"]

    class Backend:
        def fingerprint(self) -> dict:
            return {"backend": "web", "provider": "serper", "country": "us"}

    assert describe_retriever(cfg, Backend()) == {"backend": "web", "provider": "serper", "country": "us"}
    assert describe_retriever(cfg, None) is None
