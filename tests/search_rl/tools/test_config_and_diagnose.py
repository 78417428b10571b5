"""print_config (values with their source, groups) and diagnose (one report; a real retriever server's /health).

Run: python -m pytest tests/search_rl/tools/test_config_and_diagnose.py -q
"""

from __future__ import annotations

import re

from search_rl.tools import diagnose, print_config


def _line(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{key} = "))


def test_print_config_sources():
    text = print_config.render("ppo_trainer", ["algorithm=grpo", "model=tiny", "trainer.total_training_steps=3"])
    assert "#   algorithm=grpo" in text
    assert _line(text, "trainer.total_training_steps").endswith("# override")
    assert "= 3" in _line(text, "trainer.total_training_steps")
    assert _line(text, "model.path").endswith("# configs/model/tiny.yaml")
    assert _line(text, "algorithm.adv_estimator").endswith("# configs/algorithm/grpo.yaml")
    assert _line(text, "actor_rollout_ref.rollout.engine").endswith("# configs/rollout/auto.yaml")
    assert _line(text, "trainer.default_local_dir").endswith("# configs/trainer/default.yaml")
    assert _line(text, "max_turns").endswith("# default")
    assert _line(text, "algorithm.kl_horizon").endswith("# default")
    # a derived key shows the value the config derives, and where from
    derived = _line(print_config.render("ppo_trainer", ["max_turns=2"]), "actor_rollout_ref.rollout.search_turns")
    assert "= 2" in derived and derived.endswith("# derived from max_turns and do_search")
    derived = _line(print_config.render("eval", ["do_search=false"]), "actor_rollout_ref.rollout.search_turns")
    assert "= 0" in derived


def test_print_config_eval_groups_and_errors(capsys):
    assert _line(print_config.render("eval", ["data.max_samples=5"]), "data.max_samples").endswith("# override")
    groups = print_config.render_groups()
    assert "model: smollm2_135m (default), tiny" in groups
    assert "algorithm: dapo, dr_grpo, grpo, gspo, ppo (default)" in groups
    assert print_config.main(["bogus.key=1"]) == 2


def test_diagnose_report(retriever_url):
    text = diagnose.report([retriever_url, "http://127.0.0.1:9"])
    for section in ("## Versions", "## Hardware", "## Ray", "## Retriever", "## Caches"):
        assert section in text
    assert re.search(r"- torch: \d", text) and "- vllm: " in text and "- faiss-cpu: " in text
    assert f"- {retriever_url}: HTTP 200" in text and '"num_documents"' in text
    assert "http://127.0.0.1:9: not reachable" in text
