"""The engines' sampler: its draws (the exponential race, and inverse CDF from per-row uniforms) follow the softmax of
the (filtered) logits, never pick a filtered token, are reproducible from a seeded generator, and come with the
unfiltered log-probs of what they picked. (That a prefix-cached forward's last-digit differences keep a seed's draws
is the engine contract's ``test_same_seed_same_samples``.) The stop-string screen finds every stop that decoding
every row finds, and skips the rest.

Run: python -m pytest tests/search_rl/rollout/test_sampling.py -q
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_reordered_close, logprob_scale

from search_rl.datatypes import SamplingParams
from search_rl.rollout.engines.decoding import StopTails, finish_reason, sample_tokens

SIGMAS = 4.0
"""How far a token's frequency in the seeded draws may lie from its probability, in standard deviations of a
binomial share, ``sqrt(p (1 - p) / n)``: a fixed seed passes or fails for good, and a normal draw lies beyond 4 sigma
with probability 6e-5 (another CPU's last-digit differences can flip only near-tied draws, a few of 20,000)."""


def _within_sampling_noise(freq: torch.Tensor, probs: torch.Tensor, draws: int) -> bool:
    return bool(((freq - probs).abs() <= SIGMAS * (probs * (1 - probs) / draws).sqrt()).all())


@pytest.mark.parametrize("per_row_uniforms", [False, True])
def test_draws_follow_the_softmax(per_row_uniforms):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(20_000, 1)  # 20k draws of one row
    uniforms = torch.rand(20_000, generator=torch.Generator().manual_seed(5)) if per_row_uniforms else None
    params = SamplingParams(temperature=1.0)
    tok, logp = sample_tokens(logits, params, torch.Generator().manual_seed(0), uniforms)
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    expected = torch.softmax(logits[0], -1)
    assert _within_sampling_noise(freq, expected, len(tok)), (freq, expected)
    # a log-softmax over the 5 logits, perhaps summed in another order, at the scale of the logits and their
    # normaliser (tests/numerics.py; the logits as the inputs of an identity head)
    scale = logprob_scale(logits[:1], torch.eye(5))
    assert_reordered_close(logp, torch.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0], 5, scale=scale)


def test_temperature_and_top_k_shape_the_draws():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(20_000, 1)
    params = SamplingParams(temperature=0.5, top_k=2)
    tok, logp = sample_tokens(logits, params, torch.Generator().manual_seed(1))
    assert set(tok.tolist()) == {0, 1}  # the filtered tokens are never drawn
    kept = torch.softmax(logits[0, :2] / 0.5, -1)
    freq = torch.bincount(tok, minlength=2).float()[:2] / len(tok)
    assert _within_sampling_noise(freq, kept, len(tok)), (freq, kept)
    # log-probs are of the tempered distribution before filtering (what the trainer recomputes)
    tempered = torch.log_softmax(logits / 0.5, -1).gather(-1, tok[:, None])[:, 0]
    assert_reordered_close(logp, tempered, logits.shape[-1], scale=logprob_scale(logits[:1], torch.eye(5), 0.5))


def test_a_seeded_generator_reproduces_the_draws():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0)
    a, _ = sample_tokens(logits, params, torch.Generator().manual_seed(3))
    b, _ = sample_tokens(logits, params, torch.Generator().manual_seed(3))
    c, _ = sample_tokens(logits, params, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_uniform_at_the_top_never_lands_on_a_filtered_token():
    """The last vocabulary entries are filtered out (probability 0); a uniform just below 1 lands past the last
    token with probability, and the sampler takes the likeliest token instead of a filtered one."""
    logits = torch.tensor([[0.0, 3.0, 1.0, -5.0, -6.0]])
    params = SamplingParams(temperature=1.0, top_k=3)
    tok, _ = sample_tokens(logits, params, None, uniforms=torch.tensor([1.0 - 1e-9]))
    assert tok.item() in (0, 1, 2)
    tok, _ = sample_tokens(logits, params, None, uniforms=torch.tensor([0.0]))
    assert tok.item() == 0  # the first token with probability


def _tails_full(tokenizer, rows, stops):
    window = max(len(s) for s in stops) + 2
    return tokenizer.batch_decode([r[-window:] for r in rows])


@pytest.mark.parametrize(
    "text",
    [
        "<think>x</think>\n<search> capital of France </search>",
        "a>b>> </answer> <answer> Paris </answer>",
        "no stop here at all, just words and more words",
        "</sear ch> </search",
    ],
)
def test_stop_screen_finds_what_decoding_every_row_finds(tokenizer, text):
    """Token by token through texts with and without stop strings, up to the first stop (where a sample ends): the
    screened tails give the same finish reason at every step as decoding every row."""
    stops = ("</search>", "</answer>")
    screen = StopTails(tokenizer, stops)
    ids = tokenizer.encode(text, add_special_tokens=False)
    skipped = 0
    for n in range(1, len(ids) + 1):
        row = ids[:n]
        (screened,) = screen.tails([row])
        (full,) = _tails_full(tokenizer, [row], stops)
        expected = finish_reason(row[-1], full, stops, n, 10**6, ())
        assert finish_reason(row[-1], screened, stops, n, 10**6, ()) == expected, (n, full)
        skipped += screened == ""
        if expected[0] == "stop":
            break
    assert skipped > 0  # rows were screened out


def test_stop_screen_decodes_only_rows_whose_last_token_holds_a_last_character(tokenizer):
    screen = StopTails(tokenizer, ("</search>",))
    assert screen.enders is not None
    gt = tokenizer.encode(">", add_special_tokens=False)[-1]
    word = tokenizer.encode(" Paris", add_special_tokens=False)[-1]
    assert gt in screen.enders and word not in screen.enders
    assert screen.tails([[word, gt], [gt, word]]) == [tokenizer.decode([word, gt]), ""]
    assert StopTails(tokenizer, ()).tails([[word]]) == [""]


def test_a_non_ascii_stop_decodes_every_row(tokenizer):
    screen = StopTails(tokenizer, ("fin」",))
    assert screen.enders is None
    ids = tokenizer.encode("la fin」", add_special_tokens=False)
    (tail,) = screen.tails([ids])
    assert finish_reason(ids[-1], tail, ("fin」",), len(ids), 100, ())[0] == "stop"
