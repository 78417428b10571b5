"""``ScriptedLogits``: a logits processor that makes a real model write scripted turns (the tests' engines use it
through ``make_scripted_engine``; a test that builds its engine elsewhere imports it)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ScriptedLogits:
    """Logits processor forcing each sample, identified by its original prompt, through scripted turn texts.

    Turn ``k`` of a sample is the ``k``-th engine call that contains it. Past the end of a turn's script the EOS
    token is forced. The bias is large but finite, so sampled tokens still come from the sampler.
    """

    BIAS = 100.0

    def __init__(self, tokenizer, scripts: dict[tuple[int, ...], Sequence[str]]) -> None:
        self.eos = tokenizer.eos_token_id
        self.scripts = {
            p: [tokenizer.encode(t, add_special_tokens=False) for t in turns] for p, turns in scripts.items()
        }
        self.turn: dict[tuple[int, ...], int] = {p: -1 for p in scripts}

    def _owner(self, prompt: list[int]) -> tuple[int, ...]:
        for p in self.scripts:
            if tuple(prompt[: len(p)]) == p:
                return p
        raise AssertionError("ScriptedLogits: a prompt without a script reached the engine")

    def __call__(self, prompts: list[list[int]], generated: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for row, (prompt, gen) in enumerate(zip(prompts, generated, strict=True)):
            owner = self._owner(prompt)
            if not gen:
                self.turn[owner] += 1
            turns = self.scripts[owner]
            script = turns[self.turn[owner]] if self.turn[owner] < len(turns) else []
            forced = script[len(gen)] if len(gen) < len(script) else self.eos
            logits[row, forced] += self.BIAS
        return logits
