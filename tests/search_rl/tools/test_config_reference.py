"""docs/config_reference.md is generated from the config dataclasses' field docstrings and must not drift from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from search_rl.configure import load_config
from search_rl.tools import print_config

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "docs" / "config_reference.md"


@pytest.fixture(scope="module")
def generated() -> str:
    return print_config.render_reference()


def test_committed_reference_is_what_the_generator_prints(generated):
    assert REFERENCE.read_text() == generated, (
        f"docs/config_reference.md is out of date with search_rl/config/; regenerate it: "
        f"{print_config.REFERENCE_COMMAND}"
    )


def _leaf_keys(obj: object, prefix: str = "") -> list[str]:
    if dataclasses.is_dataclass(obj):
        return [k for f in dataclasses.fields(obj) for k in _leaf_keys(getattr(obj, f.name), f"{prefix}{f.name}.")]
    return [prefix.rstrip(".")]


@pytest.mark.parametrize("name", ["ppo_trainer", "sft_trainer", "eval"])
def test_reference_lists_every_key_with_its_docstring(generated, name):
    section = generated.split(f"## `configs/{name}.yaml`", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}
    keys = _leaf_keys(load_config([], config_name=name))
    assert sorted(rows) == sorted(keys)
    undocumented = [k for k in keys if rows[k].rstrip().endswith("|  |")]
    assert not undocumented, f"fields without a docstring: {undocumented}"


def test_reference_mode_on_the_command_line(capsys, generated):
    assert print_config.main(["--reference"]) == 0
    assert capsys.readouterr().out == generated
