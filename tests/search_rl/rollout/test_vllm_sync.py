"""The plumbing of vLLM weight sync that needs no engine: the weight-sync choice per machine, the offline client that
makes an in-process ``vllm.LLM`` speak vLLM's trainer-side protocol, and the weight source the GPU transfer replays.

Run: python -m pytest tests/search_rl/rollout/test_vllm_sync.py -q   (the source case needs vLLM: make install-vllm)
"""

from __future__ import annotations

import pytest
import torch

from search_rl.rollout.engines.vllm_sync import OfflineClient, resolve_weight_sync


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


def test_the_offline_client_wraps_the_payloads_the_way_llm_takes_them():
    llm = RecordingLLM()
    client = OfflineClient(llm)
    client.init_weight_transfer_engine({"packed": False})
    client.start_weight_update()
    client.update_weights({"names": ["w"]})
    client.finish_weight_update("7")
    assert llm.calls == [
        ("init_weight_transfer_engine", ({"init_info": {"packed": False}},)),
        ("start_weight_update", ()),
        ("update_weights", ({"update_info": {"names": ["w"]}},)),
        ("finish_weight_update", ("7",)),
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU choices")
def test_weight_sync_choice_on_cpu():
    assert resolve_weight_sync("auto", 1) == "disk"
    assert resolve_weight_sync("disk", 1) == "disk"
    with pytest.raises(ValueError, match="weight_sync=nccl needs CUDA"):
        resolve_weight_sync("nccl", 2)


@pytest.mark.vllm
def test_the_transfer_source_yields_each_update_in_metadata_order():
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    from search_rl.rollout.engines.vllm_sync import _state_source

    first = {"b": torch.zeros(2, 3), "a": torch.ones(4)}
    source = _state_source(first)
    assert [(m.name, m.shape) for m in source.metadata()] == [("b", (2, 3)), ("a", (4,))]
    source.tensors = {"a": torch.full((4,), 2.0), "b": torch.full((2, 3), 3.0)}
    names, tensors = zip(*source, strict=True)
    assert names == ("b", "a") and float(tensors[1][0]) == 2.0
    assert [g for g, _ in source.iter_groups()] == source.groups()
