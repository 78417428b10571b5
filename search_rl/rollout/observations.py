"""Observations inserted into the response: retrieved passages, corrective feedback, retriever errors.

Retrieved passages become ``\\n\\n<information>Doc 1(Title: T) text\\nDoc 2(Title: U) text</information>\\n\\n``
(Search-R1's layout; its pieces are in ``search_rl.tags``). Each fixed piece (tags, ``Doc i(Title: …)`` headers,
separators) and each passage text is encoded separately and the ids concatenated, so passage text can be cut at an
exact token count while the tags are never cut; decoding the ids gives back exactly ``Observation.text``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from search_rl.datatypes import Passage
from search_rl.tags import DOC_SEPARATOR, NO_RESULTS_TEXT, OBS_PREFIX, OBS_SUFFIX, doc_header, format_docs


def format_passages(passages: Sequence[Passage]) -> str:
    """The full, untruncated observation text for ``passages`` (what ``build`` produces with a large budget).

    >>> format_passages([Passage("7", "Paris", "Paris is the capital of France.")])
    '\\n\\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\\n\\n'
    """
    body = format_docs((p.title, p.text) for p in passages)
    return OBS_PREFIX + (body or NO_RESULTS_TEXT) + OBS_SUFFIX


@dataclass(frozen=True)
class Observation:
    """Token ids to insert (mask 0), their exact decoded text, and what was cut to fit the budget.

    ``passages`` are the retrieved passages as shown: texts cut like the ids, dropped passages left out.
    """

    ids: tuple[int, ...]
    text: str
    tokens_truncated: int = 0
    passages_dropped: int = 0
    passages: tuple[Passage, ...] = ()


def join_observations(observations: Sequence[Observation]) -> Observation:
    """Several observations inserted as one (a turn's tool messages): ids and text concatenated, counts summed."""
    if len(observations) == 1:
        return observations[0]
    return Observation(
        ids=tuple(i for o in observations for i in o.ids),
        text="".join(o.text for o in observations),
        tokens_truncated=sum(o.tokens_truncated for o in observations),
        passages_dropped=sum(o.passages_dropped for o in observations),
        passages=tuple(p for o in observations for p in o.passages),
    )


def water_fill(lengths: Sequence[int], budget: int) -> list[int]:
    """Largest per-item allowances with sum <= ``budget``: short items keep everything, long ones share the rest.

    >>> water_fill([5, 100, 100], 45)
    [5, 20, 20]
    """
    allow = [0] * len(lengths)
    remaining, left = budget, len(lengths)
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        share = remaining // left
        allow[i] = min(lengths[i], share)
        remaining -= allow[i]
        left -= 1
    return allow


class ObservationBuilder:
    """Encodes observations for one tokenizer, caching the ids of the fixed pieces.

    ``prefix`` and ``suffix`` frame every observation (Search-R1's ``<information>`` tags by default; the chat
    template format frames a tool message with the template's own text around its content). ``show_ids`` adds each
    passage's id to its header (when the ``open`` tool can open it).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prefix: str = OBS_PREFIX,
        suffix: str = OBS_SUFFIX,
        *,
        show_ids: bool = False,
    ) -> None:
        self.tokenizer, self.show_ids = tokenizer, show_ids
        self._prefix = self._encode(prefix)
        self._suffix = self._encode(suffix)
        self._sep = self._encode(DOC_SEPARATOR)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    @property
    def min_tokens(self) -> int:
        """Tokens of an observation with an empty body (the tags alone)."""
        return len(self._prefix) + len(self._suffix)

    def text(self, body: str, max_tokens: int) -> Observation | None:
        """A plain observation (error messages); the body is cut to fit. None if even the tags do not fit."""
        body_ids = self._encode(body)
        room = max_tokens - self.min_tokens
        if room < 0:
            return None
        kept = self._cut(body_ids, room)
        ids = self._prefix + kept + self._suffix
        return Observation(tuple(ids), self._decode(ids), tokens_truncated=len(body_ids) - len(kept))

    def feedback(self, text: str, max_tokens: int) -> Observation | None:
        """Corrective feedback inserted as is (no tags); None if it does not fit in ``max_tokens``."""
        ids = self._encode(text)
        return Observation(tuple(ids), self._decode(ids)) if len(ids) <= max_tokens else None

    def passages(self, passages: Sequence[Passage], max_tokens: int) -> Observation | None:
        """The observation for retrieved ``passages`` within ``max_tokens``; None if even the tags do not fit.

        Passage texts share what the fixed pieces leave (``water_fill``); trailing passages are dropped whole only
        when their headers alone do not fit. Both are counted in the result.
        """
        if not passages:
            return self.text(NO_RESULTS_TEXT, max_tokens)
        heads = [
            self._encode(doc_header(i + 1, p.title, p.id if self.show_ids else None)) for i, p in enumerate(passages)
        ]
        bodies = [self._encode(" " + p.text) for p in passages]
        n = len(passages)
        while n > 0 and self.min_tokens + sum(len(h) for h in heads[:n]) + len(self._sep) * (n - 1) > max_tokens:
            n -= 1
        if n == 0:  # not even one header fits: the tags alone, everything counted as cut
            obs = self.text("", max_tokens)
            if obs is None:
                return None
            return Observation(obs.ids, obs.text, sum(len(b) for b in bodies), len(passages))
        room = max_tokens - self.min_tokens - sum(len(h) for h in heads[:n]) - len(self._sep) * (n - 1)
        allow = water_fill([len(b) for b in bodies[:n]], room)
        ids = list(self._prefix)
        truncated = sum(len(b) for b in bodies[n:])
        shown = []
        for i in range(n):
            if i:
                ids += self._sep
            kept = self._cut(bodies[i], allow[i])
            truncated += len(bodies[i]) - len(kept)
            ids += heads[i] + kept
            cut = len(kept) < len(bodies[i])
            shown.append(replace(passages[i], text=self._decode(kept).removeprefix(" ")) if cut else passages[i])
        ids += self._suffix
        return Observation(tuple(ids), self._decode(ids), truncated, len(passages) - n, tuple(shown))

    def _cut(self, ids: list[int], n: int) -> list[int]:
        """First ``n`` ids, backing off so a multi-byte character is not split (its bytes would decode to U+FFFD)."""
        if len(ids) <= n:
            return ids
        kept = ids[:n]
        for _ in range(3):  # a UTF-8 character spans at most 4 byte-level tokens
            if not kept or not self._decode(kept).endswith("\ufffd"):
                break
            kept = kept[:-1]
        return kept
