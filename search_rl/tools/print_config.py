"""The resolved config, each value with where it came from: ``python -m search_rl.tools.print_config [overrides]``.

    python -m search_rl.tools.print_config                              # the trainer's defaults
    python -m search_rl.tools.print_config algorithm=grpo model=tiny trainer.total_training_steps=3
    python -m search_rl.tools.print_config --config eval model.path=runs/demo/global_step_3/actor
    python -m search_rl.tools.print_config --groups                     # config groups and their options
    python -m search_rl.tools.print_config --reference > docs/config_reference.md   # every key, as Markdown

Sources, from weakest to strongest (the order Hydra applies them): ``default`` (the dataclass field in
``search_rl/config/``), a group file (``configs/model/tiny.yaml``), the primary file
(``configs/ppo_trainer.yaml``), then ``override`` (the command line). Interpolated values are shown resolved, and a
key the config derives from others (``actor_rollout_ref.rollout.search_turns``) as derived, with the keys it comes
from. The config is composed by Hydra exactly as ``main_ppo`` / ``main_eval`` compose it, so an unknown key or one
that moved fails here too.

``--reference`` writes the configuration reference (``docs/config_reference.md``): every key of the three entry
points with its type, default and the docstring under its dataclass field, the one place a field is documented.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import logging
import operator
import sys
import textwrap
from typing import Any, cast

import yaml
from omegaconf import OmegaConf, open_dict

from search_rl.config import CONFIG_DIR, check_renamed, register_configs, to_typed
from search_rl.config.loading import DERIVED_KEYS
from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging

logger = logging.getLogger(__name__)

PACKAGE_HEADER = "# @package "


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists and scalars are leaves.

    >>> flatten({"a": {"b": 1, "c": [1, 2]}, "d": None})
    {'a.b': 1, 'a.c': [1, 2], 'd': None}
    """
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def groups() -> dict[str, list[str]]:
    """Config groups (sub-folders of ``configs/`` holding YAML files) and their options."""
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(CONFIG_DIR.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def group_file_keys(group: str, option: str) -> dict[str, str]:
    """Flattened keys a group option sets (its own ``defaults`` first), each mapped to the file that set it last."""
    path = CONFIG_DIR / group / f"{option}.yaml"
    text = path.read_text()
    package = group
    for line in text.splitlines():
        if line.startswith(PACKAGE_HEADER):
            package = line[len(PACKAGE_HEADER) :].strip()
    data = yaml.safe_load(text) or {}
    out: dict[str, str] = {}
    for entry in data.pop("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            out.update(group_file_keys(group, entry))
    rel = str(path.relative_to(CONFIG_DIR.parent))
    out.update({f"{package}.{key}": rel for key in flatten(data)})
    return out


def override_key(override: str) -> str | None:
    """The dotted key a command-line override sets (``+a.b=1`` → ``a.b``); None for a group choice or a deletion."""
    if override.startswith("~") or "=" not in override:
        return None
    key = override.split("=", 1)[0].lstrip("+")
    return None if key in groups() else key


def compose(config_name: str, overrides: list[str]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The resolved config as a plain dict, the chosen option of every group, and the value of each derived key
    (``DERIVED_KEYS``) as the typed config sets it (the composed config holds only its field's default)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    check_renamed(config_name, overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        composed = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    choices = {k: str(v) for k, v in composed.hydra.runtime.choices.items() if not k.startswith("hydra")}
    with open_dict(composed):
        del composed["hydra"]
    resolved = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(resolved, dict)
    typed = to_typed(composed)
    derived = {key: operator.attrgetter(key)(typed) for key in DERIVED_KEYS}
    return cast(dict[str, Any], resolved), choices, derived


def sources(config_name: str, overrides: list[str], choices: dict[str, str], keys: list[str]) -> dict[str, str]:
    """Where each flattened key's value came from (see the module docstring)."""
    origin = dict.fromkeys(keys, "default")
    for group, option in choices.items():
        if group in groups():
            origin.update({k: f for k, f in group_file_keys(group, option).items() if k in origin})
    primary = yaml.safe_load((CONFIG_DIR / f"{config_name}.yaml").read_text()) or {}
    primary.pop("defaults", None)
    primary.pop("hydra", None)
    rel = f"configs/{config_name}.yaml"
    origin.update({k: rel for k in flatten(primary) if k in origin})
    for override in overrides:
        key = override_key(override)
        if key is not None:
            origin.update({k: "override" for k in origin if k == key or k.startswith(key + ".")})
    return origin


def render(config_name: str, overrides: list[str]) -> str:
    """The report: chosen groups, then ``key = value    # source`` per leaf."""
    resolved, choices, derived = compose(config_name, overrides)
    flat = flatten(resolved) | derived
    origin = sources(config_name, overrides, choices, list(flat))
    origin.update({key: f"derived from {DERIVED_KEYS[key]}" for key in derived})
    lines = [f"# configs/{config_name}.yaml with {' '.join(overrides) or 'no overrides'}", "# groups:"]
    lines += [f"#   {g}={o}" for g, o in sorted(choices.items()) if g in groups()]
    width = max(len(f"{k} = {v!r}") for k, v in flat.items())
    lines += [f"{f'{k} = {v!r}':<{width}}  # {origin[k]}" for k, v in flat.items()]
    return "\n".join(lines) + "\n"


def render_groups() -> str:
    """Every config group with its options (the trainer's default choice marked)."""
    defaults = yaml.safe_load((CONFIG_DIR / "ppo_trainer.yaml").read_text())["defaults"]
    chosen = {k: v for entry in defaults if isinstance(entry, dict) for k, v in entry.items()}
    lines = []
    for group, options in groups().items():
        marked = [f"{o} (default)" if chosen.get(group) == o else o for o in options]
        lines.append(f"{group}: {', '.join(marked)}")
    lines.append(
        "experiment configs: "
        + (
            ", ".join(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
            if (CONFIG_DIR / "experiment").is_dir()
            else "none"
        )
    )
    return "\n".join(lines) + "\n"


REFERENCE_ENTRIES = (
    ("ppo_trainer", "python -m search_rl.main_ppo"),
    ("sft_trainer", "python -m search_rl.main_sft"),
    ("eval", "python -m search_rl.main_eval"),
)
"""The entry points the reference documents, in order: their primary config and their command."""

REFERENCE_COMMAND = "python -m search_rl.tools.print_config --reference > docs/config_reference.md"


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass and its dataclass bases: the string literal under each field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = cast(ast.ClassDef, ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]).body
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def reference_rows(config: Any, raw: dict[str, Any], prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """``(key, type, default, docstring)`` of every leaf of a typed config; the default as the YAML gives it
    (``raw``: the composed config, interpolations not resolved)."""
    docs = field_docs(type(config))
    rows: list[tuple[str, str, Any, str]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            rows += reference_rows(value, raw.get(f.name) or {}, f"{prefix}{f.name}.")
        else:
            rows.append((prefix + f.name, str(f.type), raw.get(f.name, value), docs.get(f.name, "")))
    return rows


def yaml_value(value: Any) -> str:
    """A default as it is written on the command line or in YAML.

    >>> yaml_value([None, True, 1e-06, "a"]), yaml_value({})
    ('[null, true, 1e-06, a]', '{}')
    """
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list | tuple):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    """Table-cell text: double-backtick (reST) literals as Markdown ones, pipes escaped."""
    return text.replace("``", "`").replace("|", "\\|")


def render_reference() -> str:
    """The configuration reference in Markdown: per entry point, one table per top-level group."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from search_rl.configure import load_config

    lines = [
        "# Configuration reference",
        "",
        f"Generated from the config dataclasses' field docstrings (`search_rl/config/`) by `{REFERENCE_COMMAND}`;",
        "do not edit it by hand: edit the docstring, then run that command. Defaults are those of each entry point",
        "run with no arguments; a group option (`algorithm=grpo`) or a `key=value` on the command line changes them,",
        "and `python -m search_rl.tools.print_config [overrides]` shows the resolved values with where each came from",
        "([configuration.md](configuration.md)).",
        "",
        "Config groups and their options (`group=option` on the command line):",
        "",
    ]
    lines += [f"- `{line.split(': ', 1)[0]}`: {line.split(': ', 1)[1]}" for line in render_groups().splitlines()]
    register_configs()
    for config_name, command in REFERENCE_ENTRIES:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            composed = hydra_compose(config_name=config_name, overrides=[])
        raw = cast(dict[str, Any], OmegaConf.to_container(composed, resolve=False))
        config = load_config([], config_name=config_name)
        lines += ["", f"## `configs/{config_name}.yaml` (`{command}`)", "", f"Typed root: `{type(config).__name__}`."]
        sections: dict[str, list[tuple[str, str, Any, str]]] = {}
        for row in reference_rows(config, raw):
            sections.setdefault(row[0].split(".", 1)[0] if "." in row[0] else "", []).append(row)
        for section, rows in sections.items():
            title = f"`{section}.*`" if section else "top level"
            lines += ["", f"### {config_name}: {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
            lines += [
                f"| `{key}` | `{_cell(kind)}` | `{_cell(yaml_value(default))}` | {_cell(doc)} |"
                for key, kind, default, doc in rows
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as on the main_ppo / main_eval command line")
    ap.add_argument("--config", choices=("ppo_trainer", "eval"), default="ppo_trainer", help="which entry's config")
    ap.add_argument("--groups", action="store_true", help="list the config groups and their options")
    ap.add_argument(
        "--reference", action="store_true", help="every key of every entry point as Markdown (docs/config_reference.md)"
    )
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        if args.reference:
            text = render_reference()
        else:
            text = render_groups() if args.groups else render(args.config, args.overrides)
    except Exception as e:  # process boundary: Hydra's compose errors name the bad key
        logger.error("cannot compose the config: %s", e)
        return 2
    sys.stdout.write(text)  # the report is the program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
