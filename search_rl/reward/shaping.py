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
"""

from __future__ import annotations

from search_rl.datatypes import RewardResult

PARTIAL_CREDITS = ("f1", "subem")
"""Components that ``partial_credit`` may name."""
MAX_FORMAT_SCORE = 0.5
"""``format_score`` must stay below this, so that ``1 - fs`` (right, malformed) beats ``fs`` (wrong, well-formed)."""


def shaping_enabled(format_score: float, partial_credit: str | None) -> bool:
    """Whether ``shape_reward`` changes anything (with both off the reward is exactly the base score)."""
    return format_score > 0 or partial_credit is not None


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
