"""Building a rollout's tools and action format from its config: ``search`` over the search backend, the built-in
``open``, and the classes ``rollout.tools`` names by entry point (``Class(**settings)``, checked like any tool).

``check_tool_specs`` runs when the config is resolved, before Ray starts, so a wrong entry fails in a second with
its position and name; the workers build the same tools again with ``build_tools``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from transformers import PreTrainedTokenizerBase

from search_rl.config import ConfigError, RolloutConfig
from search_rl.config.tools import ToolSpec
from search_rl.registry import Registry
from search_rl.rollout.backends import RecordingRetriever
from search_rl.rollout.tools.base import ActionFormat, Tool, check_tool, function_schema
from search_rl.rollout.tools.open import DocumentSource, OpenTool
from search_rl.rollout.tools.search import Retriever, SearchTool

KEY = "actor_rollout_ref.rollout.tools"
_CLASSES: Registry[Any] = Registry("tool class")


def _where(i: int, spec: ToolSpec) -> str:
    return f"{KEY}[{i}] ({spec.name})"


def _serves_documents(retriever: Retriever | None) -> TypeGuard[DocumentSource]:
    """A ``DocumentSource`` that can answer: a ``RecordingRetriever`` has ``documents`` over any backend, and says
    with ``serves_documents`` whether the backend it records serves them."""
    return isinstance(retriever, DocumentSource) and bool(getattr(retriever, "serves_documents", True))


def _backend_name(retriever: Retriever) -> str:
    if isinstance(retriever, RecordingRetriever):  # name what it records, not the wrapper
        return f"{retriever.fp.backend} (recorded, fingerprint {retriever.fp.id})"
    return type(retriever).__name__


def _instantiate(i: int, spec: ToolSpec, retriever: Retriever | None, cfg: RolloutConfig | None) -> Tool:
    """Build entry ``i``; a built-in ``open`` over ``retriever`` (None: only its settings are checked)."""
    where = _where(i, spec)
    if not spec.entry_point:  # a built-in (config.tools.BUILTIN_TOOLS)
        on_error = cfg.on_retriever_error if cfg is not None else "raise"
        source = retriever if _serves_documents(retriever) else None
        if retriever is not None and source is None:
            raise ConfigError(
                f"{where}: the search backend {_backend_name(retriever)} serves no documents; open needs the "
                "retriever service (retriever.backend=http, with or without a recording, or a replay of one)"
            )
        factory: Any = lambda **kw: OpenTool(source, on_error=on_error, **kw)  # noqa: E731
    else:
        try:
            factory = _CLASSES.get(spec.entry_point)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{where}: entry_point {spec.entry_point!r} cannot be imported: {e}") from e
    try:
        tool = factory(**dict(spec.settings))
    except TypeError as e:
        raise ConfigError(f"{where}: settings {dict(spec.settings)} do not fit the tool's constructor: {e}") from e
    try:
        check_tool(tool, where)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
    if tool.name != spec.name:
        raise ConfigError(f"{where}: the class calls itself {tool.name!r}; name the entry {tool.name!r}")
    return tool


def check_tool_specs(specs: Sequence[ToolSpec], search_backend: str | None = None) -> None:
    """Import and build every entry of ``rollout.tools`` once, and check its declaration.

    Args:
        specs: ``rollout.tools``.
        search_backend: ``retriever.backend`` when known (``open`` needs ``http`` or ``replay``; a replay of a
            backend that served no documents is refused when the workers build the tools).

    Raises:
        ConfigError: an entry point that cannot be imported, settings its constructor refuses, a declaration a
            chat template could not use, or ``open`` without the retriever service; the message names the entry.
    """
    for i, spec in enumerate(specs):
        _instantiate(i, spec, None, None)
        if not spec.entry_point and search_backend not in (None, "http", "replay"):
            raise ConfigError(
                f"{_where(i, spec)}: open reads documents from the retriever service, and retriever.backend is "
                f"{search_backend}, which serves none; use retriever.backend=http (a recording of it replays with "
                "retriever.backend=replay) or drop the tool"
            )


def build_tools(cfg: RolloutConfig, retriever: Retriever | None, extra: Sequence[Tool] = ()) -> list[Tool]:
    """The rollout's tools: ``search`` (when there is a retriever), then ``cfg.tools`` in order, then ``extra``.

    Raises:
        ConfigError: as ``check_tool_specs``; two tools with one name.
    """
    tools: list[Tool] = []
    if retriever is not None:
        tools.append(SearchTool(retriever, cfg.on_retriever_error, cfg.max_query_chars))
    tools += [_instantiate(i, spec, retriever, cfg) for i, spec in enumerate(cfg.tools)]
    for tool in extra:
        check_tool(tool, f"tool {getattr(tool, 'name', tool)!r}")
        tools.append(tool)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"two tools share a name: {names}")
    return tools


def _declared(cfg: RolloutConfig, search: bool) -> list[Tool]:
    """The rollout's tools built without a backend (for their declarations; ``open`` gets no document source)."""
    tools: list[Tool] = [SearchTool(None)] if search else []  # type: ignore[arg-type]  # the schema needs no backend
    return tools + [_instantiate(i, spec, None, cfg) for i, spec in enumerate(cfg.tools)]


def tool_schemas(cfg: RolloutConfig, search: bool = True) -> list[dict[str, Any]]:
    """The function declarations of the rollout's tools (``search`` first when ``search``); built without a backend.

    >>> [s["function"]["name"] for s in tool_schemas(RolloutConfig())]
    ['search']
    """
    return [function_schema(t) for t in _declared(cfg, search)]


def prompt_tools(cfg: RolloutConfig, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]] | None:
    """What the prompts list as tools (``prompt_data.encode_prompt``'s ``tools``): under the ``chat_template``
    format, the declarations of the tools the loop offers (search and ``cfg.tools``); None under Search-R1's tags,
    whose protocol is in the prompt's own text, or when the loop makes no tool turns. The entry points call it
    before Ray starts, so a template that cannot render the tools fails there.

    Raises:
        ConfigError: ``chat_template`` with a tokenizer whose template ignores tools or tool messages.
    """
    if cfg.action_format != "chat_template" or cfg.search_turns == 0:
        return None
    tools = _declared(cfg, search=True)
    try:
        build_format(cfg, tokenizer, tools)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return [function_schema(t) for t in tools]


def build_format(cfg: RolloutConfig, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Tool]) -> ActionFormat:
    """The action format ``cfg.action_format`` names, over ``tools``."""
    if cfg.action_format == "chat_template":
        from search_rl.rollout.tools.chat_format import ChatTemplateFormat

        return ChatTemplateFormat(tokenizer, tools)
    from search_rl.rollout.tools.tag_format import TagFormat

    return TagFormat(tokenizer, tools, cfg.max_query_chars)
