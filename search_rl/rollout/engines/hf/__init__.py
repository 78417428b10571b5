"""The ``hf`` engine: transformers' own model forward with a hand-written decode loop, for any causal LM.

- ``engine.py``: ``HFEngine``, batched left-padded decoding with per-sample stop strings and prefix reuse.
- ``session.py``: ``HFSession``, continuous batching (sequences join and leave the running batch while it decodes).
- ``growing_cache.py``: a ``DynamicCache`` whose layers grow in place instead of by ``torch.cat`` every step.
- ``packed_decode.py``: decode attention per KV head for grouped-query models (transformers before 5.23).
"""

from search_rl.rollout.engines.hf.engine import HFEngine

__all__ = ["HFEngine"]
