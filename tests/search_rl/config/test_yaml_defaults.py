"""One source for each default: the config dataclasses (``search_rl/config/``). The YAML tree holds group choices
and real overrides only, so

- composed with Hydra as each entry point composes it (no overrides), every key a YAML file sets has the root
  dataclass's default (``PPOConfig()``, ``SFTConfig()``, ``EvalConfig()`` and the entry agree), and
- no YAML file restates a default: each value it sets differs from the root dataclass's, except a group option
  naming what it picks (``model.path``, ``actor_rollout_ref.rollout.engine``) and interpolations (``${...}``).

The algorithm presets (``configs/algorithm/``) are recipes: each names its published settings in full, so that a
changed dataclass default cannot change a published recipe; they are not checked here (``test_presets.py`` is).

Run: python -m pytest tests/search_rl/config/test_yaml_defaults.py -q
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from search_rl.config import CONFIG_DIR, EvalConfig, PPOConfig, SFTConfig, register_configs

ROOTS: dict[str, type] = {"ppo_trainer": PPOConfig, "sft_trainer": SFTConfig, "eval": EvalConfig}
PRESET_GROUPS = ("algorithm",)
"""Groups whose options are recipes (not checked)."""
NAMING_KEYS = ("model.path", "actor_rollout_ref.rollout.engine")
"""Keys a group option states even where they equal the default: they name what the option picks."""
PACKAGE_HEADER = "# @package "


def dataclass_defaults(cls: type, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: default}`` of every leaf of the dataclass ``cls``: its fields' defaults, nested dataclasses
    walked through their default factories (the root's own ``__post_init__`` does not run)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        else:
            assert f.default_factory is not dataclasses.MISSING, f"{cls.__name__}.{f.name} has no default"
            value = f.default_factory()
        out.update(_leaves(value, f"{prefix}{f.name}"))
    return out


def _leaves(value: Any, key: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            k: v
            for f in dataclasses.fields(value)
            for k, v in _leaves(getattr(value, f.name), f"{key}.{f.name}").items()
        }
    return {key: value}


def yaml_leaves(node: Any, prefix: str = "", top: bool = True) -> dict[str, Any]:
    """``{dotted key: value}`` a YAML mapping sets (its ``defaults`` list and ``hydra`` left out); an empty dict such
    as ``reward.by_data_source: {}`` is one leaf."""
    out: dict[str, Any] = {}
    for key, value in (node or {}).items():
        if top and key in ("defaults", "hydra"):
            continue
        if isinstance(value, dict) and value:
            out.update(yaml_leaves(value, f"{prefix}{key}.", top=False))
        else:
            out[f"{prefix}{key}"] = value
    return out


def package_of(path: Path, group: str) -> str:
    """Where a group option's keys land: its ``# @package`` header, else the group's name (``_global_``: the root)."""
    package = group
    for line in path.read_text().splitlines():
        if line.startswith(PACKAGE_HEADER):
            package = line[len(PACKAGE_HEADER) :].strip()
    return "" if package == "_global_" else package + "."


def root_groups(name: str) -> dict[str, str]:
    """``{group: chosen option}`` of a root YAML's defaults list."""
    defaults = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["defaults"]
    return {g: o for d in defaults if isinstance(d, dict) for g, o in d.items() if not g.startswith("override")}


def chosen_files(name: str) -> set[str]:
    """The files composed by the root ``name`` with no overrides: itself, its chosen options and the options these
    start from (their own defaults lists)."""
    files = {f"{name}.yaml"}
    todo = list(root_groups(name).items())
    while todo:
        group, option = todo.pop()
        files.add(f"{group}/{option}.yaml")
        own = yaml.safe_load((CONFIG_DIR / group / f"{option}.yaml").read_text()) or {}
        todo += [(group, d) for d in own.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    return files


def set_keys(name: str) -> dict[str, dict[str, Any]]:
    """``{file: {dotted key: value}}`` of every file the root ``name`` may compose: itself and every option of the
    groups it chooses from (preset groups left out)."""
    files = {f"{name}.yaml": yaml_leaves(yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text()))}
    for group in root_groups(name):
        if group in PRESET_GROUPS:
            continue
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            files[f"{group}/{path.name}"] = yaml_leaves(yaml.safe_load(path.read_text()), package_of(path, group))
    return files


def _interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_the_composed_defaults_are_the_dataclass_defaults(name):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        composed = OmegaConf.to_container(compose(config_name=name), resolve=False)
    composed_leaves = yaml_leaves({k: v for k, v in composed.items() if k != "hydra"})
    defaults = dataclass_defaults(ROOTS[name])
    chosen = chosen_files(name)
    keys = {k for f, leaves in set_keys(name).items() if f in chosen for k in leaves}
    disagree = {
        k: (composed_leaves[k], defaults[k])
        for k in sorted(keys)
        if not _interpolation(composed_leaves[k]) and composed_leaves[k] != defaults[k]
    }
    assert not disagree, (
        f"configs/{name}.yaml composes to values its dataclass {ROOTS[name].__name__} does not default to "
        f"({{key: (yaml, dataclass)}}): {disagree}; move the value into the dataclass and drop it from the YAML"
    )


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_no_yaml_file_restates_a_default(name):
    defaults = dataclass_defaults(ROOTS[name])
    restated = sorted(
        f"configs/{file}: {key}={value!r}"
        for file, leaves in set_keys(name).items()
        for key, value in leaves.items()
        if key not in NAMING_KEYS and not _interpolation(value) and key in defaults and value == defaults[key]
    )
    assert not restated, f"defaults restated in YAML (the dataclass is their one source; delete them): {restated}"


def test_every_key_the_yaml_sets_is_a_field():
    unknown = sorted(
        f"configs/{file}: {key}"
        for name, cls in ROOTS.items()
        for file, leaves in set_keys(name).items()
        for key in leaves
        if key not in dataclass_defaults(cls)
    )
    assert not unknown, unknown


def test_the_check_sees_a_restated_default(tmp_path):
    # a value equal to the field's default is caught; a different one, a naming key and an interpolation are not
    defaults = dataclass_defaults(PPOConfig)
    leaves = yaml_leaves(
        {
            "trainer": {"n_workers": 1, "seed": 3, "default_local_dir": "runs/${x}"},
            "model": {"path": "smollm2-135m-instruct"},
        }
    )
    restated = [k for k, v in leaves.items() if k not in NAMING_KEYS and not _interpolation(v) and v == defaults[k]]
    assert restated == ["trainer.n_workers"]
