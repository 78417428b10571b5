"""vLLM generation backend (GPU; the ``[vllm]`` extra). Thin: maps our ``SamplingParams`` onto vLLM's and back.

Written against vLLM's documented offline API: ``LLM.generate(prompts=[TokensPrompt(prompt_token_ids=...)],
sampling_params=[SamplingParams(...)] per prompt)`` returning ``RequestOutput.outputs[0]`` with ``token_ids``,
``logprobs``, ``finish_reason`` (``"stop"``/``"length"``) and ``stop_reason`` (the matched stop string, or None for
EOS). Weights are updated in place with ``LLM.apply_model(lambda m: m.load_weights(weights))`` followed by
``LLM.reset_prefix_cache()`` (cached prefixes were computed with the old weights). With vLLM's multiprocess V1
engine, ``apply_model`` ships a closure to the worker and needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.

Log-probs: vLLM reports the raw model distribution by default; pass ``logprobs_mode="processed_logprobs"``
(vLLM >= 0.10.2) for the temperature-scaled one that the HF engine reports. The trainer recomputes old log-probs
either way; rollout log-probs are for diagnostics and importance-ratio checks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from search_rl.datatypes import FinishReason, Generated, SamplingParams
from search_rl.rollout.engines.base import check_generate_args
from search_rl.seeds import sample_seed

logger = logging.getLogger(__name__)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise ImportError("the vLLM rollout backend needs vLLM: install search-rl[vllm] (GPU machines)") from e
    return vllm


class VLLMEngine:
    """``RolloutEngine`` over ``vllm.LLM``.

    Args:
        model: a local HF model directory (nothing is downloaded when ``HF_HUB_OFFLINE=1``).
        gpu_memory_utilization: share of GPU memory vLLM may take (leave room for the trainer when colocated).
        max_model_len: context length; None = the model's.
        seed: engine seed (per-request seeds come from ``SamplingParams.seed``).
        logprobs_mode: passed to ``vllm.LLM`` when set (e.g. ``"processed_logprobs"``).
        **llm_kwargs: any further ``vllm.LLM`` argument (``dtype``, ``enforce_eager``, ``tensor_parallel_size``...).
    """

    def __init__(
        self,
        model: str,
        *,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        logprobs_mode: str | None = None,
        **llm_kwargs: Any,
    ) -> None:
        self._vllm = _import_vllm()
        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
        self.llm = self._vllm.LLM(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            **llm_kwargs,
        )
        tokenizer = self.llm.get_tokenizer()
        if tokenizer.eos_token_id is None:
            raise ValueError(f"VLLMEngine: the tokenizer of {model} defines no EOS token")
        self._eos = (int(tokenizer.eos_token_id),)
        self._max_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._version = 0

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def weight_version(self) -> int:
        return self._version

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generated]:
        limits = check_generate_args(prompts, params, max_new_tokens, self.max_model_len)
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

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights into every vLLM worker in place, then drop the prefix cache."""
        weights = list(named_tensors)
        self.llm.apply_model(lambda model: model.load_weights(weights=weights))
        self.llm.reset_prefix_cache()
        self._version = version
        logger.debug("VLLMEngine loaded %d tensors, weight version %d", len(weights), version)
