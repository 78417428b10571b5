"""The command that runs Ray's CLI (``ray start``, ``ray status``, ``ray stop``) for the running interpreter.

``ray`` on PATH may belong to another Python, or be missing: a venv used without activation has its own ``ray``
beside its interpreter but not on PATH, and a venv made with ``--system-site-packages`` over a Python that has Ray
has no ``ray`` script at all (pip installed Ray's script in the base Python's folder, whose shebang runs the base
interpreter, without the venv's packages). So the command is the interpreter's own ``ray`` script when there is
one, else the CLI's console entry point run by this interpreter. It lives here, with no heavy imports, because
the retriever's Ray Serve tests and ``search_rl`` (which may import ``retriever_server``, not the reverse) use it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
from pathlib import Path

SCRIPT_NAME = "ray.exe" if os.name == "nt" else "ray"
"""The file name of Ray's console script in a scripts folder."""


def ray_cli(scripts_dir: Path | None = None) -> list[str]:
    """The command (argv prefix) that runs Ray's CLI for this interpreter: ``ray_cli() + ["status"]``.

    Args:
        scripts_dir: where this interpreter's console scripts are installed; default ``sysconfig``'s ``scripts``
            path (the venv's ``bin/`` inside a venv).

    Returns:
        ``[<scripts_dir>/ray]`` if that script is there, else ``[sys.executable, "-c", ...]`` running the ``ray``
        console entry point that the ``ray`` distribution declares (what the script itself would run). Never a
        ``ray`` found on PATH.

    Raises:
        FileNotFoundError: Ray is not installed for this interpreter.
    """
    folder = Path(sysconfig.get_path("scripts")) if scripts_dir is None else scripts_dir
    script = folder / SCRIPT_NAME
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    try:
        scripts = importlib.metadata.distribution("ray").entry_points.select(group="console_scripts", name="ray")
    except importlib.metadata.PackageNotFoundError:
        scripts = importlib.metadata.EntryPoints()
    entry = next(iter(scripts), None)
    if entry is None:
        raise FileNotFoundError(
            f"Ray's CLI: no {SCRIPT_NAME} script in {folder}, and {sys.executable} has no Ray package declaring one;"
            " install search-rl into this environment (pip install -e ., Ray is one of its dependencies)"
        )
    module, _, attr = entry.value.partition(":")
    # as pip's generated script does: the program name Ray's help and errors print, and main()'s exit status
    code = f"import sys; sys.argv[0] = 'ray'; from {module} import {attr}; sys.exit({attr}())"
    return [sys.executable, "-c", code]
