"""An example custom tool to copy: a glossary whose entries come from the config (docs/tools.md).

actor_rollout_ref:
  rollout:
    tools:
      - name: glossary
        entry_point: search_rl.rollout.tools.example:Glossary
        settings: {entries: {RL: reinforcement learning, EM: exact match}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search_rl.rollout.tools.base import ToolResult


class Glossary:
    """``glossary(term)``: the definition of a term, from ``entries``."""

    name = "glossary"
    description = "Look up the definition of a term."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"term": {"type": "string", "description": "The term to define."}},
        "required": ["term"],
    }

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = {k.lower(): v for k, v in entries.items()}

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        term = str(arguments["term"]).strip()
        if term.lower() not in self.entries:  # a recoverable failure: the model reads it
            return ToolResult(f"No entry for {term!r}.", failed=True)
        return ToolResult(f"{term}: {self.entries[term.lower()]}")
