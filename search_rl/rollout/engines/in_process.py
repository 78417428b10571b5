"""What the two in-process engines (``hf`` and ``static``) share: a transformers model held in this process, its EOS
ids, the prefix store of the previous call, the ``generate`` frame (argument checks, eval and inference mode, the
prefix store's turn), and weight updates copied into the model's own tensors."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from search_rl.config import HFEngineConfig
from search_rl.datatypes import Generated, SamplingParams
from search_rl.models.weights import load_weights
from search_rl.rollout.engines.base import check_generate_args
from search_rl.rollout.engines.decoding import StopTails
from search_rl.rollout.engines.prefix_cache import PrefixStore

logger = logging.getLogger(__name__)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, engine: str) -> tuple[int, ...]:
    """Every id that ends a sequence: the model's ``generation_config`` EOS id(s) and the tokenizer's.

    Raises:
        ValueError: neither defines one (``engine`` names the caller in the message).
    """
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
    found = tuple(sorted(i for i in ids if i is not None))
    if not found:
        raise ValueError(f"{engine}: neither the model's generation_config nor the tokenizer defines an EOS token")
    return found


class InProcessEngine:
    """The state, the ``generate`` frame and the weight path of an engine that runs ``model`` in this process
    (subclasses implement ``_generate``)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: HFEngineConfig | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg or HFEngineConfig()
        self._version = 0
        self.prefix = PrefixStore()
        self.shared_prompt_tokens = 0
        """Prompt tokens not encoded because an identical prompt in the same call was (a counter for tests/logs)."""
        self._eos = eos_token_ids(model, tokenizer, type(self).__name__)
        self._stop_tails: dict[tuple[str, ...], StopTails] = {}

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generated]:
        """``RolloutEngine.generate``: checks the call, runs ``_generate`` in inference mode with the model in eval
        mode (restored after), and makes this call's finished sequences the prefixes the next call may reuse."""
        limits = check_generate_args(prompts, params, max_new_tokens, self.max_model_len)
        if not prompts:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                return self._generate([list(p) for p in prompts], limits, params)
        finally:
            self.model.train(was_training)
            self.prefix.rotate()

    def _generate(self, prompts: list[list[int]], limits: list[int], params: SamplingParams) -> list[Generated]:
        """One ``Generated`` per prompt, in order (``prompts`` non-empty, ``limits`` checked)."""
        raise NotImplementedError

    def stop_tails(self, stops: tuple[str, ...]) -> StopTails:
        """The stop-string screen for ``stops`` (built once: it decodes the vocabulary)."""
        if stops not in self._stop_tails:
            self._stop_tails[stops] = StopTails(self.tokenizer, stops)
        return self._stop_tails[stops]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self.cfg.max_model_len or int(self.model.config.max_position_embeddings)

    @property
    def weight_version(self) -> int:
        return self._version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy tensors into the model's tensors of the same state-dict names, in place (so captured graphs stay
        valid); a tied tensor may come under any of its names (``models.weights.load_weights``), and every tensor of
        the model must be given.

        Raises:
            KeyError: for a name the model does not have, or a model tensor nothing was given for.
            ValueError: for a shape mismatch.
        """
        n = load_weights(self.model, named_tensors)
        self._version = version
        self.prefix.clear()  # stored KV states were computed with the old weights
        logger.debug("%s loaded %d tensors, weight version %d", type(self).__name__, n, version)
