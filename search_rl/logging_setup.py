"""The one logging setup of every entry point and worker process: level, format, and nothing configured twice.

Entry points that Hydra starts (``main_ppo``, ``main_eval``, ``main_sft``) get Hydra's job logging instead; the
retriever service (``retriever_server``, which never imports ``search_rl``) configures its own in ``app.py``.
"""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Format of every log line of a worker or a long job."""
MESSAGE_FORMAT = "%(message)s"
"""Format of command-line tools whose log lines are their output (the demo, the plotting and viewing tools)."""
QUIET_LOGGERS = ("httpx",)
"""Libraries that log one INFO line per HTTP request (health polls, searches); kept at WARNING."""


def configure_logging(level: int | str = logging.INFO, fmt: str = LOG_FORMAT) -> None:
    """Send INFO (or ``level``) logs to stderr in ``fmt``; if the root logger already has handlers (a library or the
    host application configured logging first) only the level is applied. ``QUIET_LOGGERS`` log warnings only."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format=fmt)
    else:
        root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
