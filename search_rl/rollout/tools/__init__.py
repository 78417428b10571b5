"""The tool seam under the agent loop: what a tool is, the tools that ship, and the two formats a model calls them in.

- ``base.py``: the ``Tool`` protocol (``name``, ``description``, JSON-schema ``parameters``, async ``call``), its
  ``ToolResult``, the parsed ``TurnAction`` and the ``ActionFormat`` protocol;
- ``search.py``: ``SearchTool``, the search backends (``rollout/backends``) as the ``search`` tool;
- ``open.py``: ``OpenTool``, a search hit's whole article from the retriever (``POST /documents``);
- ``tag_format.py``: Search-R1's tags (the default); ``chat_format.py``: the model's chat-template tool calls;
- ``loading.py``: the tools and format of a ``RolloutConfig`` (``rollout.tools``, ``rollout.action_format``);
- ``example.py``: a small custom tool to copy (docs/tools.md).
"""

from search_rl.rollout.observations import join_observations
from search_rl.rollout.tools.base import (
    ActionFormat,
    BatchTool,
    Tool,
    ToolCall,
    ToolResult,
    TurnAction,
    argument_problem,
    check_tool,
    describe_call,
    function_schema,
)
from search_rl.rollout.tools.loading import build_format, build_tools, check_tool_specs, prompt_tools, tool_schemas
from search_rl.rollout.tools.open import DocumentSource, OpenTool
from search_rl.rollout.tools.search import KeyedRetriever, Retriever, SearchTool

__all__ = [
    "ActionFormat",
    "BatchTool",
    "DocumentSource",
    "KeyedRetriever",
    "OpenTool",
    "Retriever",
    "SearchTool",
    "Tool",
    "ToolCall",
    "ToolResult",
    "TurnAction",
    "argument_problem",
    "build_format",
    "build_tools",
    "check_tool",
    "check_tool_specs",
    "describe_call",
    "function_schema",
    "join_observations",
    "prompt_tools",
    "tool_schemas",
]
