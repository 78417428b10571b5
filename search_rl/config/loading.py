"""Composing configs: the schemas registered in Hydra's ``ConfigStore`` (so an unknown key or a wrong type fails at
compose time), ``compose_config`` for code that composes without ``@hydra.main`` (``search_rl.configure.load_config``
adds the registry checks), unknown-key detection, the keys that moved (an old key fails with a message naming its new
path), and ``ConfigError``, the error every configuration check raises."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration that cannot run; raised before Ray starts, with what is wrong and how to fix it."""


CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
"""The YAML configs (``ppo_trainer.yaml``, ``eval.yaml`` and their groups)."""


SCHEMAS = {"ppo_trainer": "PPOConfig", "sft_trainer": "SFTConfig", "eval": "EvalConfig"}
"""Each entry point's YAML and its root dataclass."""

RENAMED: dict[str, dict[str, str]] = {
    "eval": {"rollout": "actor_rollout_ref.rollout", "engine": "actor_rollout_ref.rollout.hf"},
    "sft_trainer": {
        "optim": "actor_rollout_ref.actor.optim",
        "grad_clip": "actor_rollout_ref.actor.grad_clip",
        "micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    },
}
"""Keys that moved so that every entry point names a setting by the same path: ``{config: {old prefix: new}}``."""

SEARCH_KEY_COPIES = {f"actor_rollout_ref.rollout.{key}": key for key in ("do_search", "max_turns")}
"""The rollout's former copies of Search-R1's top-level keys: each setting has one key now, the top-level one."""

DERIVED_KEYS = {"actor_rollout_ref.rollout.search_turns": "max_turns and do_search"}
"""Keys the config derives from others (named), never set directly."""


def register_configs() -> None:
    """Register every root schema in Hydra's ConfigStore (each YAML lists ``<name>_schema`` first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    from search_rl.config.eval import EvalConfig
    from search_rl.config.ppo import PPOConfig
    from search_rl.config.sft import SFTConfig

    store = ConfigStore.instance()
    for name, node in (("ppo_trainer", PPOConfig), ("sft_trainer", SFTConfig), ("eval", EvalConfig)):
        store.store(name=f"{name}_schema", node=node)


def renamed_key_errors(config_name: str, overrides: Sequence[str]) -> list[str]:
    """One message per override that uses a key which moved (``RENAMED``, ``SEARCH_KEY_COPIES``), naming the key to
    use, or sets a derived key (``DERIVED_KEYS``), naming the keys it comes from."""
    moved = RENAMED.get(config_name, {})
    errors = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        moved_to = (new + key[len(old) :] for old, new in moved.items() if key == old or key.startswith(old + "."))
        path = next(moved_to, key)
        if path in SEARCH_KEY_COPIES:
            errors.append(
                f"{key} is now {SEARCH_KEY_COPIES[path]}: the top-level key (Search-R1's) is the setting's one key, "
                "and the rollout reads it"
            )
        elif path in DERIVED_KEYS:
            errors.append(f"{key} is derived from {DERIVED_KEYS[path]}; set those instead")
        elif path != key:
            errors.append(f"{key} is now {path} (the same path in every entry point)")
    return errors


def check_renamed(config_name: str, overrides: Sequence[str]) -> None:
    """Raise for overrides of keys that moved.

    Raises:
        ConfigError: naming each old key and its new path.
    """
    errors = renamed_key_errors(config_name, overrides)
    if errors:
        raise ConfigError("; ".join(errors))


def exit_on_renamed(config_name: str, argv: Sequence[str]) -> None:
    """For ``python -m`` entry points, before Hydra parses ``argv``: exit 2 with one line per moved key (Hydra's own
    error would only say the old key is unknown)."""
    import sys

    errors = renamed_key_errors(config_name, [a for a in argv if "=" in a and not a.startswith("-")])
    if errors:
        print("error: " + "; ".join(errors), file=sys.stderr)  # noqa: T201 (before logging is configured)
        sys.exit(2)


def compose_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> Any:
    """Compose ``configs/<config_name>.yaml`` with command-line style overrides into its typed config
    (``PPOConfig``, ``SFTConfig`` or ``EvalConfig``, see ``SCHEMAS``).

    Raises:
        ConfigError: a key that moved (naming its new path), or a field out of range (``__post_init__``).
        hydra/omegaconf errors: an unknown key or a value of the wrong type.
    """
    from hydra import compose, initialize_config_dir

    check_renamed(config_name, overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        composed = compose(config_name=config_name, overrides=list(overrides))
    return to_typed(composed)


def unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Dotted keys of ``node`` that ``schema`` (a dataclass) does not declare, recursively (keys added with Hydra's
    ``+`` are otherwise accepted silently). Dict-typed fields such as ``reward.by_data_source`` take any key."""
    if not dataclasses.is_dataclass(schema) or not isinstance(node, DictConfig):
        return []
    hints = typing.get_type_hints(schema)
    out: list[str] = []
    for key in node:
        name = str(key)
        if name not in hints:
            out.append(prefix + name)
        elif dataclasses.is_dataclass(hints[name]):
            out += unknown_keys(node._get_node(name), hints[name], f"{prefix}{name}.")
    return out


def to_typed(composed: object) -> Any:
    """The dataclass tree of a composed ``DictConfig`` (interpolations resolved, ``__post_init__`` checks run).

    Raises:
        ConfigError: a key the schema does not have (a typo, or one added with ``+``).
    """
    if isinstance(composed, DictConfig):
        schema = OmegaConf.get_type(composed)
        unknown = unknown_keys(composed, schema) if isinstance(schema, type) else []
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; `--cfg job` prints every key (docs/configuration.md)")
    return OmegaConf.to_object(composed)
