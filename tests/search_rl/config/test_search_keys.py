"""``do_search`` and ``max_turns`` have one home, the top-level keys (Search-R1's): every entry point's config derives
the rollout's ``search_turns`` from them once (``derive_search_turns``), whether it is built in Python or composed
from YAML, and the rollout's former copies (``actor_rollout_ref.rollout.max_turns`` / ``do_search``, eval's
``rollout.*``) and the derived key itself are refused on the command line, naming the key to set.

Run: python -m pytest tests/search_rl/config/test_search_keys.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from search_rl.config import ConfigError, EvalConfig, PPOConfig, SFTConfig
from search_rl.config.rollout import derive_search_turns
from search_rl.configure import load_config

REPO = Path(__file__).resolve().parents[3]
ROOTS = [PPOConfig, SFTConfig, EvalConfig]
CONFIGS = ["ppo_trainer", "sft_trainer", "eval"]


def test_search_turns_are_max_turns_where_search_is_on():
    assert [derive_search_turns(True, 3), derive_search_turns(False, 3), derive_search_turns(True, 0)] == [3, 0, 0]
    with pytest.raises(ConfigError, match="max_turns must be >= 0, got -1"):
        derive_search_turns(True, -1)


@pytest.mark.parametrize("root", ROOTS)
def test_the_top_level_keys_built_in_python_reach_the_rollout(root):
    assert root().actor_rollout_ref.rollout.search_turns == 4
    assert root(max_turns=2).actor_rollout_ref.rollout.search_turns == 2
    assert root(max_turns=2, do_search=False).actor_rollout_ref.rollout.search_turns == 0


@pytest.mark.parametrize("config_name", CONFIGS)
def test_the_top_level_keys_on_the_command_line_reach_the_rollout(config_name):
    cfg = load_config(["max_turns=2"], config_name=config_name)
    assert (cfg.max_turns, cfg.actor_rollout_ref.rollout.search_turns) == (2, 2)
    cfg = load_config(["max_turns=2", "do_search=false"], config_name=config_name)
    assert (cfg.max_turns, cfg.do_search, cfg.actor_rollout_ref.rollout.search_turns) == (2, False, 0)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_rollout_ref.rollout.max_turns=2", "max_turns"),
        ("actor_rollout_ref.rollout.do_search=false", "do_search"),
        ("+actor_rollout_ref.rollout.max_turns=2", "max_turns"),
    ],
)
def test_a_rollout_copy_is_refused_naming_the_top_level_key(config_name, override, key):
    old = override.split("=")[0].lstrip("+")
    with pytest.raises(ConfigError, match=rf"^{re.escape(old)} is now {key}: the top-level key"):
        load_config([override], config_name=config_name)


def test_evaluations_old_rollout_key_is_refused_naming_the_top_level_key():
    with pytest.raises(ConfigError, match=r"^rollout\.max_turns is now max_turns: "):
        load_config(["rollout.max_turns=2"], config_name="eval")


@pytest.mark.parametrize("config_name", CONFIGS)
def test_the_derived_key_is_refused_naming_what_it_comes_from(config_name):
    with pytest.raises(ConfigError, match="search_turns is derived from max_turns and do_search; set those"):
        load_config(["actor_rollout_ref.rollout.search_turns=2"], config_name=config_name)


@pytest.mark.integration
def test_the_trainer_command_line_names_the_key_to_use():
    proc = subprocess.run(
        [sys.executable, "-m", "search_rl.main_ppo", "actor_rollout_ref.rollout.max_turns=2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "actor_rollout_ref.rollout.max_turns is now max_turns" in proc.stderr
