"""Reward shaping on top of a scoring function: a format reward and partial credit, with exact match as the headline.

A 135M policy rarely gets an exact match, so pure EM gives RL almost no signal early on. Shaping gives a wrong
answer a little reward for following the tag protocol (Search-R1's ``format_score``; DeepSeek-R1's format reward)
and, optionally, for being close (token F1 or sub-EM of the extracted answer, scaled by a weight). With the default
``qa_em`` base the rule is (``fs`` = ``format_score``, ``w`` = ``partial_credit_weight``, ``p`` = partial credit):

=================  ==============  ===================
answer (EM)        well-formed     score
=================  ==============  ===================
right              yes             1
right              no              1 - fs
wrong              yes             max(fs, w * p)
wrong              no              w * p
=================  ==============  ===================

The format is worth ``fs`` either way: a wrong answer gains it for good form, a right one loses it for bad form
(Search-R1's ``score - structure_format_score``). Since ``p <= 1``, the bounds ``fs < 0.5`` and ``w < 1 - fs``
(checked by ``RewardConfig``) make every right answer score strictly more than every wrong one. Only the score
changes: the components (em, subem, f1, format, answered) stay the answer-quality measures that evaluation reports.

**Overlong penalty** (DAPO's soft overlong punishment, https://arxiv.org/abs/2503.14476, ``apply_overlong_penalty``),
added after the table: with ``L`` the response's length in tokens, ``L_max`` = ``rollout.max_response_tokens`` and
``b`` = ``reward.overlong_buffer_tokens``, the score gains ``-factor * min(max(L - (L_max - b), 0) / b, 1)``: nothing up
to ``L_max - b`` tokens, then linearly down to ``-factor`` at the budget. ``L`` is the whole response, model tokens
*and* inserted observations (``len(response_ids)``), because that is the length the budget counts and whose
exhaustion cuts an episode short (``stop_reason = max_response_tokens``); the penalty teaches the policy to finish
before the cut, and a long ``<information>`` block brings the cut closer as much as long reasoning does. Near the
budget it can make a right answer score below a wrong one, as DAPO intends. It is reported as the component
``overlong_penalty``.

**Per-search penalty** (``apply_search_penalty``, off by default): each search the episode sent costs
``reward.search_penalty`` (a price on retrieval, e.g. when the search engine is a paid web API); reported as the
component ``search_penalty``. It pushes the policy towards fewer searches, also where a search would have found the
answer, so keep it well below the reward of a right answer.
"""

from __future__ import annotations

from search_rl.config.run import MAX_FORMAT_SCORE, PARTIAL_CREDITS, shaping_enabled
from search_rl.datatypes import RewardResult

__all__ = [
    "MAX_FORMAT_SCORE",
    "PARTIAL_CREDITS",
    "apply_overlong_penalty",
    "apply_search_penalty",
    "overlong_penalty",
    "shape_reward",
    "shaping_enabled",
]


def shape_reward(
    result: RewardResult,
    format_score: float = 0.0,
    partial_credit: str | None = None,
    partial_credit_weight: float = 0.0,
) -> RewardResult:
    """Apply the table of the module docstring to a base ``result`` (values assumed valid, see ``RewardConfig``).

    "Right" is ``components["em"] == 1``; a right answer keeps its base score (1 for every built-in), minus
    ``format_score`` when the episode is malformed. A wrong answer gets the largest of its base score, ``format_score``
    when well-formed, and ``partial_credit_weight * components[partial_credit]``.

    >>> base = RewardResult(0.0, {"em": 0.0, "f1": 0.5, "format": 1.0})
    >>> shape_reward(base, format_score=0.1, partial_credit="f1", partial_credit_weight=0.4).score
    0.2
    >>> shape_reward(RewardResult(1.0, {"em": 1.0, "format": 0.0}), format_score=0.2).score
    0.8

    Raises:
        ValueError: the scoring function does not report a component the shaping reads.
    """
    if not shaping_enabled(format_score, partial_credit):
        return result
    needed = ("em", "format", *((partial_credit,) if partial_credit else ()))
    missing = [k for k in needed if k not in result.components]
    if missing:
        raise ValueError(
            f"reward shaping reads the components {list(needed)}, but the scoring function reported only "
            f"{sorted(result.components)}; report {missing} from it, or turn shaping off (reward.format_score=0, "
            "reward.partial_credit=null)"
        )
    c = result.components
    well_formed = c["format"] == 1.0
    if c["em"] == 1.0:
        score = result.score if well_formed else result.score - format_score
    else:
        candidates = [result.score]
        if well_formed and format_score > 0:
            candidates.append(format_score)
        if partial_credit is not None:
            candidates.append(partial_credit_weight * c[partial_credit])
        score = max(candidates)
    return RewardResult(score, dict(c))


def overlong_penalty(response_tokens: int, max_response_tokens: int, buffer_tokens: int, factor: float) -> float:
    """DAPO's soft overlong punishment of a response of ``response_tokens`` tokens (0 when ``buffer_tokens`` is 0).

    >>> [overlong_penalty(n, 1000, 400, 1.0) for n in (500, 700, 900, 1000)]  # penalty from 600 tokens on
    [0.0, -0.25, -0.75, -1.0]

    Raises:
        ValueError: a buffer as large as the budget (every response would be penalised), naming both keys.
    """
    if buffer_tokens <= 0:
        return 0.0
    if buffer_tokens >= max_response_tokens:
        raise ValueError(
            f"reward.overlong_buffer_tokens={buffer_tokens} must be below actor_rollout_ref.rollout.max_response_tokens"
            f"={max_response_tokens}: the penalty starts buffer_tokens before the budget"
        )
    excess = response_tokens - (max_response_tokens - buffer_tokens)
    return -factor * min(excess / buffer_tokens, 1.0) if excess > 0 else 0.0


def apply_overlong_penalty(
    result: RewardResult, response_tokens: int, max_response_tokens: int, buffer_tokens: int, factor: float
) -> RewardResult:
    """``result`` with ``overlong_penalty(...)`` added to its score and reported as component ``overlong_penalty``;
    unchanged when ``buffer_tokens`` is 0 (off).

    >>> apply_overlong_penalty(RewardResult(1.0, {"em": 1.0}), 950, 1000, 100, 1.0)
    RewardResult(score=0.5, components={'em': 1.0, 'overlong_penalty': -0.5})
    """
    if buffer_tokens <= 0:
        return result
    penalty = overlong_penalty(response_tokens, max_response_tokens, buffer_tokens, factor)
    return RewardResult(result.score + penalty, {**result.components, "overlong_penalty": penalty})


def apply_search_penalty(result: RewardResult, searches: int, per_search: float) -> RewardResult:
    """``result`` with ``-per_search * searches`` added to its score and reported as component ``search_penalty``.

    >>> apply_search_penalty(RewardResult(1.0, {"em": 1.0}), 2, 0.05)
    RewardResult(score=0.9, components={'em': 1.0, 'search_penalty': -0.1})
    """
    penalty = -per_search * searches
    return RewardResult(round(result.score + penalty, 12), {**result.components, "search_penalty": penalty})
