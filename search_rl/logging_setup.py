"""The one logging setup of every entry point and worker process: level, format, and nothing configured twice."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Format of every log line."""


def configure_logging(level: int | str = logging.INFO) -> None:
    """Send INFO (or ``level``) logs to stderr in ``LOG_FORMAT``; a no-op if the root logger already has handlers
    (a library or the host application configured logging first), except that the level is applied."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format=LOG_FORMAT)
    else:
        root.setLevel(level)
