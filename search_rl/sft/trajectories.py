"""Warm-start examples: the ``trajectory`` column of an SFT parquet → token-exact ``Trajectory`` objects.

A row's ``trajectory`` is a list of turns ``{"text": str, "passages": [{"id", "title", "text"}, ...]}``
(``data_prep.synth_sft`` writes them; docs/data.md). Every turn but the last searches, and its passages are what the
retriever returned for that query; the last turn answers. The token sequence is assembled exactly as a rollout
assembles it (``LLMGenerationManager``): each model turn's text encoded on its own (mask 1), then the observation
built from the passages by the rollout's own ``ObservationBuilder`` under the same budgets (mask 0). So SFT trains on
the very layout RL later samples in, and the loss mask keeps retrieved tokens out of the loss just as in RL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from search_rl.config import RolloutConfig
from search_rl.datatypes import Passage, Segment, Trajectory, TrajectoryStats
from search_rl.reward.format import format_ok
from search_rl.reward.qa_em import is_judgement, normalize_answer
from search_rl.rollout.actions import parse_action
from search_rl.rollout.observations import ObservationBuilder

SKIP_REASONS = (
    "prompt_too_long",
    "too_many_searches",
    "turn_too_long",
    "response_too_long",
    "answer_cut_from_observations",
)
"""Why an example can be left out of training under the rollout budgets (each counted and reported)."""


class SkipExample(Exception):
    """An example that is valid but does not fit the rollout budgets; ``reason`` is one of ``SKIP_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class SFTTurn:
    """One model turn of a warm-start example and the passages its search returned (none for the answer turn)."""

    text: str
    passages: tuple[Passage, ...] = ()


def parse_turns(raw: Any, where: str, max_query_chars: int = 512) -> list[SFTTurn]:
    """Validate one row's ``trajectory`` value and return its turns.

    Raises:
        ValueError: naming ``where`` (file and row) and what is wrong: not a list of turns, a turn that is not a
            search (all but the last) or an answer (the last), or a broken tag protocol.
    """
    if raw is None or isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__") or len(raw) == 0:
        raise ValueError(f"{where}: `trajectory` must be a non-empty list of turns, got {raw!r:.80}")
    turns: list[SFTTurn] = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, Mapping) or not isinstance(turn.get("text"), str):
            raise ValueError(f"{where}: trajectory turn {i} must be a mapping with a string `text`")
        passages = []
        raw_passages = turn.get("passages")
        for j, p in enumerate(raw_passages if raw_passages is not None else ()):
            if not isinstance(p, Mapping) or not all(isinstance(p.get(k), str) for k in ("id", "title", "text")):
                raise ValueError(f"{where}: trajectory turn {i} passage {j} needs string `id`, `title` and `text`")
            passages.append(Passage(p["id"], p["title"], p["text"]))
        turns.append(SFTTurn(turn["text"], tuple(passages)))
    for i, turn in enumerate(turns):
        want = "answer" if i == len(turns) - 1 else "search"
        action = parse_action(turn.text, max_query_chars=max_query_chars)
        if action.kind != want:
            raise ValueError(f"{where}: trajectory turn {i} should be a {want} action, parses as {action.kind}")
        if want == "answer" and turn.passages:
            raise ValueError(f"{where}: the final (answer) turn has passages; only search turns have them")
    if not format_ok([t.text for t in turns]):
        raise ValueError(f"{where}: the turns break the tag protocol (search_rl.reward.format.format_ok)")
    return turns


def answer_shown(seen: Sequence[str], answer: str) -> bool:
    """Whether an answer given after the observations ``seen`` could have been read there: no observation (it did not
    search), a yes/no judgement (``is_judgement``), or an observation containing it (``contains_answer``).

    >>> answer_shown([], "Paris"), answer_shown(["Lyon is big."], "Yes"), answer_shown(["Lyon is big."], "Paris")
    (True, True, False)
    """
    return not seen or is_judgement(answer) or any(contains_answer(text, answer) for text in seen)


def contains_answer(text: str, answer: str) -> bool:
    """Whether the normalised ``answer`` occurs in the normalised ``text`` on word boundaries.

    >>> contains_answer("Doc 1(Title: Paris) Paris is the capital.", "paris"), contains_answer("Parisian", "Paris")
    (True, False)
    """
    needle = normalize_answer(answer)
    return bool(needle) and re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", normalize_answer(text)) is not None


def build_trajectory(
    prompt_ids: Sequence[int],
    turns: Sequence[SFTTurn],
    tokenizer: PreTrainedTokenizerBase,
    observations: ObservationBuilder,
    cfg: RolloutConfig,
) -> Trajectory:
    """The token-exact trajectory of ``turns`` after ``prompt_ids``, as a rollout under ``cfg`` would build it.

    Raises:
        SkipExample: the prompt, a turn, the number of searches or the whole response exceeds ``cfg``'s budgets, or
            the observation budget cut the answer out of every passage (the model would learn to answer unseen).
    """
    if len(prompt_ids) > cfg.max_prompt_tokens:
        raise SkipExample("prompt_too_long", f"{len(prompt_ids)} > max_prompt_tokens={cfg.max_prompt_tokens}")
    searches = len(turns) - 1
    if searches > cfg.search_turns:
        raise SkipExample("too_many_searches", f"{searches} searches > {cfg.search_turns} search turns")
    ids: list[int] = []
    mask: list[int] = []
    segments: list[Segment] = []
    stats = TrajectoryStats()
    truncated = dropped = 0
    for i, turn in enumerate(turns):
        turn_ids = list(tokenizer.encode(turn.text, add_special_tokens=False))
        if len(turn_ids) > cfg.max_turn_tokens:
            raise SkipExample("turn_too_long", f"turn {i} has {len(turn_ids)} > max_turn_tokens={cfg.max_turn_tokens}")
        start = len(ids)
        ids += turn_ids
        mask += [1] * len(turn_ids)
        segments.append(Segment("model", start, len(ids), turn.text))
        if i == len(turns) - 1:
            break
        room = min(cfg.max_obs_tokens, cfg.max_response_tokens - len(ids))
        obs = observations.passages(turn.passages, room) if room > 0 else None
        if obs is None:
            raise SkipExample("response_too_long", f"no room for the observation of turn {i}")
        start = len(ids)
        ids += obs.ids
        mask += [0] * len(obs.ids)
        segments.append(Segment("observation", start, len(ids), obs.text))
        truncated, dropped = truncated + obs.tokens_truncated, dropped + obs.passages_dropped
    if len(ids) > cfg.max_response_tokens:
        raise SkipExample("response_too_long", f"{len(ids)} > max_response_tokens={cfg.max_response_tokens}")
    answer = parse_action(turns[-1].text).content or ""
    if not answer_shown([s.text for s in segments if s.kind == "observation"], answer):
        raise SkipExample(
            "answer_cut_from_observations", "the observation budget cut every passage text holding the answer"
        )
    stats = TrajectoryStats(
        turns=len(turns),
        searches=searches,
        valid_actions=len(turns),
        finished=True,
        obs_tokens_truncated=truncated,
        obs_passages_dropped=dropped,
    )
    return Trajectory(
        prompt_ids=torch.tensor(list(prompt_ids), dtype=torch.long),
        response_ids=torch.tensor(ids, dtype=torch.long),
        response_mask=torch.tensor(mask, dtype=torch.long),
        rollout_logprobs=torch.zeros(len(ids), dtype=torch.float32),
        segments=tuple(segments),
        final_answer=parse_action(turns[-1].text).content,
        stop_reason="answer",
        stats=stats,
    )
