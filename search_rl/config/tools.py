"""The tools a rollout offers besides ``search`` (``actor_rollout_ref.rollout.tools``) and the format the model calls
them in (``actor_rollout_ref.rollout.action_format``); docs/tools.md.

Data and single-field checks only: the classes named by ``entry_point`` are imported and their schemas checked when
the config is resolved, before Ray starts (``search_rl.rollout.tools.loading.check_tool_specs``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from search_rl.config.loading import ConfigError

ACTION_FORMATS = ("tags", "chat_template")
BUILTIN_TOOLS = ("open",)
"""Tools named without an ``entry_point`` (``search`` is always there when the rollout searches)."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class ToolSpec:
    """One tool: a built-in by name (``{name: open}``), or a class of yours (``{name: glossary, entry_point:
    my_pkg.tools:Glossary, settings: {...}}``)."""

    name: str = ""
    """The name the model calls it by (an identifier; the class's ``name`` must agree)."""
    entry_point: str = ""
    """``package.module:Class`` of a tool class, built as ``Class(**settings)``; empty for a built-in tool."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the tool's constructor."""


def check_tool_entries(specs: list[ToolSpec], key: str = "actor_rollout_ref.rollout.tools") -> None:
    """The single-field checks of ``rollout.tools``: names, entry-point syntax, no duplicates.

    Raises:
        ConfigError: an entry with a bad or repeated name, or an entry point not written ``module:Class``.
    """
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        where = f"{key}[{i}] ({spec.name or 'no name'})"
        if not _NAME.match(spec.name) or spec.name == "search":
            raise ConfigError(
                f"{where}: name must be an identifier other than 'search' (the search tool is always there), "
                f"got {spec.name!r}"
            )
        if spec.name in seen:
            raise ConfigError(f"{where}: a second tool named {spec.name!r}; tool names must be unique")
        seen.add(spec.name)
        if not spec.entry_point and spec.name not in BUILTIN_TOOLS:
            raise ConfigError(
                f"{where}: no entry_point, and {spec.name!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}); "
                "set entry_point: package.module:Class"
            )
        if spec.entry_point and not _ENTRY_POINT.match(spec.entry_point):
            raise ConfigError(f"{where}: entry_point must be 'package.module:Class', got {spec.entry_point!r}")


def check_action_format(value: str, key: str = "actor_rollout_ref.rollout.action_format") -> None:
    """Raises ConfigError unless ``value`` is one of ``ACTION_FORMATS``."""
    if value not in ACTION_FORMATS:
        raise ConfigError(
            f"{key} must be one of {ACTION_FORMATS} (tags: Search-R1's <search>/<answer>; chat_template: the "
            f"model's own tool calls), got {value!r}"
        )
