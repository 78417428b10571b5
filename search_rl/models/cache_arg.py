"""The keyword under which a transformers model's ``forward`` takes its KV cache.

transformers 5.24 renamed ``past_key_values`` to ``cache`` in every model's ``forward`` and warns on the old name
(removed in 5.40); earlier 5.x releases only know ``past_key_values``. Callers pass ``{CACHE_KWARG: cache}``.
"""

from __future__ import annotations

import inspect

from transformers import LlamaModel

CACHE_KWARG: str = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
"""``cache`` on transformers >= 5.24, ``past_key_values`` before (the rename applies to every model at once)."""
