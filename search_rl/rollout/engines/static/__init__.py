"""The ``static`` engine: Llama/Qwen2 decoding over a pre-allocated KV cache, with captured decode steps on CUDA.

- ``engine.py``: ``StaticEngine``, the HF engine's contract over the lean forward, with prefill, readback and fallbacks.
- ``lean_decoder.py``: the forward written for decoding (fused projections, RMSNorm and RoPE), over the HF parameters.
- ``slot_cache.py``: the KV cache of fixed slots, one per sequence, token ``t`` at column ``t``.
- ``decode_state.py``: a call's per-slot device state (the step's sampling) and per-sequence host state.
- ``step_graphs.py``: CUDA-graph capture of decode steps, each checked against its eager step before it is trusted.
"""

from search_rl.rollout.engines.static.engine import StaticEngine

__all__ = ["StaticEngine"]
