"""What the server may show any caller: messages with absolute paths cut to their last part.

``/health``, 503 answers and the search settings a client records (``identity.search_settings``) pass messages and
model names through ``without_paths``; the server log keeps the whole message. It sits below ``api/`` so the core
(``identity.py``) can use it without importing the HTTP layer.
"""

from __future__ import annotations

import re
from pathlib import Path

_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])[~/][^\s'\"():,;]*")


def without_paths(text: str) -> str:
    """``text`` with every absolute path cut to its last part: what ``/health`` and 503s show to any caller (the
    server log keeps the whole message).

    >>> without_paths("ValueError: /home/ann/c.jsonl:3: duplicate id; see http://x/y")
    'ValueError: c.jsonl:3: duplicate id; see http://x/y'
    """
    return _ABSOLUTE_PATH.sub(lambda m: Path(m.group()).name or m.group(), text)
