"""SDPA against eager attention in the trainer's kind of pass, on the real policy: the evidence for
``model.attn_implementation``'s default.

Times one forward + backward of the policy (``--model``, in ``--dtype``) over ``--batch`` sequences of ``--prompt``
prompt and ``--response`` response tokens, left-padded prompts and right-padded responses as the trainer batches
them, in two shapes:

- ``full``: the whole sequence in one pass (the warm start's and the critic's pass, and the actor's with
  ``actor.share_prompts=false``);
- ``shared``: one prompt encoded once into a KV cache, the responses' pass reading it (the actor's pass with shared
  prompts, GRPO's ``n`` samples of one prompt);

each with ``full`` weights (every parameter gets a gradient: full fine-tuning) and ``frozen`` weights (only the
activations do: the backward a LoRA update runs, less the adapters' own small matmuls). Attention alternates SDPA /
eager call by call; each figure is the median of ``--repeats`` timed calls after one untimed call of each.

    python bench/trainer_attention_bench.py                 # ~5 min on 2 cores (AVX512-BF16)
    python bench/trainer_attention_bench.py --model <warm start>/actor --batch 8

Last line: ``trainer_attention_bench dtype=<d> eager_over_sdpa_min=<x> eager_over_sdpa_max=<x>`` (eager's time over
SDPA's: above 1 means SDPA is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from search_rl.models.loading import CACHE_KWARG, SMOLLM2, dtype_of, load_model

ATTENTIONS = ("sdpa", "eager")


def padded_batch(batch: int, prompt: int, response: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): random token ids; row ``b``'s prompt left-padded and its response right-padded by different
    amounts (up to a quarter of the prompt and two thirds of the response)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, vocab, (batch, prompt + response), generator=g)
    mask = torch.ones(batch, prompt + response, dtype=torch.long)
    for b in range(batch):
        mask[b, : (b * 13) % max(1, prompt // 4)] = 0
        cut = (b * 37) % max(1, 2 * response // 3)
        if cut:
            mask[b, -cut:] = 0
    return ids, mask


def full_pass(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, frozen: bool) -> None:
    """Forward + backward over the whole sequences."""
    embeds = model.get_input_embeddings()(ids)
    if frozen:
        embeds = embeds.detach().requires_grad_()
    out = model(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
    out.logits.float().logsumexp(-1).mean().backward()


def shared_pass(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, prompt: int, frozen: bool) -> None:
    """Row 0's prompt (all but its last token) encoded once without gradient, then every row's last prompt token
    and response read it as a KV cache; forward + backward of the response pass."""
    batch = ids.shape[0]
    with torch.no_grad():
        pre = model(input_ids=ids[:1, : prompt - 1], attention_mask=mask[:1, : prompt - 1], use_cache=True)
    cache = DynamicCache()
    for i, layer in enumerate(pre.past_key_values.layers):
        cache.update(layer.keys.expand(batch, -1, -1, -1).contiguous(), layer.values.expand(batch, -1, -1, -1), i)
    full_mask = torch.cat([mask[:1, : prompt - 1].expand(batch, -1), mask[:, prompt - 1 :]], dim=1)
    embeds = model.get_input_embeddings()(ids[:, prompt - 1 :])
    if frozen:
        embeds = embeds.detach().requires_grad_()
    out = model(inputs_embeds=embeds, attention_mask=full_mask, use_cache=True, **{CACHE_KWARG: cache})
    out.logits.float().logsumexp(-1).mean().backward()


def time_call(fn: Callable[[], None]) -> float:
    """Seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=SMOLLM2, help="the packaged policy, or an HF folder (a warm start's actor/)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=250)
    ap.add_argument("--response", type=int, default=450)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=dtype_of(args.dtype)).train()
    ids, mask = padded_batch(args.batch, args.prompt, args.response, model.config.vocab_size, seed=0)
    print(
        f"{args.model} in {args.dtype}, {torch.get_num_threads()} threads; batch {args.batch} x "
        f"({args.prompt} prompt + {args.response} response) tokens",
        flush=True,
    )
    print("| pass | weights | sdpa s | eager s | eager / sdpa |\n|---|---|---|---|---|")
    ratios = []
    for shape in ("full", "shared"):
        for weights in ("full", "frozen"):
            frozen = weights == "frozen"
            for p in model.parameters():
                p.requires_grad_(not frozen)

            def call(attn: str, shape: str = shape, frozen: bool = frozen) -> float:
                model.set_attn_implementation(attn)
                model.zero_grad(set_to_none=True)
                if shape == "full":
                    return time_call(lambda: full_pass(model, ids, mask, frozen))
                return time_call(lambda: shared_pass(model, ids, mask, args.prompt, frozen))

            for attn in ATTENTIONS:  # untimed
                call(attn)
            times: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
            for _ in range(args.repeats):
                for attn in ATTENTIONS:
                    times[attn].append(call(attn))
            sdpa, eager = (statistics.median(times[a]) for a in ATTENTIONS)
            ratios.append(eager / sdpa)
            print(f"| {shape} | {weights} | {sdpa:.2f} | {eager:.2f} | {eager / sdpa:.2f} |", flush=True)
    print(
        f"trainer_attention_bench dtype={args.dtype} eager_over_sdpa_min={min(ratios):.2f} "
        f"eager_over_sdpa_max={max(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
