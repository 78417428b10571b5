"""The actor update's passes with and without ``SharedPrompts`` (each distinct prompt encoded once), on one process.

A GRPO batch of the learning benchmark's shape: ``--prompts`` real training prompts (chat template applied) times
``--samples`` samples, each response ``--response-tokens`` long (uniformly jittered by a quarter) of which the first
``--model-tokens`` and the last 16 carry loss (the model's turns) and the rest is an observation (mask 0). Token ids
of the responses are random: they do not change the cost. Mini-batches of ``--mini`` samples (whole groups), micro-
batches of 1, as the trainer runs them; no FSDP, no Ray, no rollout, so only the lever differs between the rows.

Per row: the update (forward, log-softmax gather of the loss tokens, backward; one AdamW step per mini-batch) and the
no-grad log-prob pass (what old or reference log-probs cost), each the median of ``--repeats`` runs, the two rows
alternating so that drift in the machine's speed hits both.

    python bench/shared_prompts_bench.py --model runs/l14/sft/global_step_12/actor --lora-rank 16

Last line: ``shared_prompts_bench update_s=<plain>-><shared> logprob_s=<plain>-><shared>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import fields

import torch

from search_rl.batches import TrainBatch
from search_rl.models import load_model, load_tokenizer
from search_rl.models.lora import apply_lora
from search_rl.prompt_data import PromptDataset, read_rows
from search_rl.workers.forward import response_logprobs
from search_rl.workers.shared_prompts import SharedPrompts


def build_batch(tokenizer, prompts: int, samples: int, response: int, model_tokens: int, seed: int) -> TrainBatch:
    """Real prompts, random responses with a loss mask on the model's turns; left/right padded like the trainer."""
    rows = read_rows(["data/datasets/nq_hotpotqa_mini/train.parquet"])[:prompts]
    data = PromptDataset(rows, tokenizer, 1024, False).batch(range(prompts)).repeat_interleave(samples)
    gen = torch.Generator().manual_seed(seed)
    lengths = [response + int(torch.randint(-response // 4, response // 4 + 1, (1,), generator=gen)) for _ in data.uids]
    p, t, b = max(len(x) for x in data.prompt_ids), max(lengths), len(data.uids)
    input_ids = torch.full((b, p + t), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, p + t), dtype=torch.long)
    response_mask = torch.zeros((b, t), dtype=torch.long)
    for i, (prompt, n) in enumerate(zip(data.prompt_ids, lengths, strict=True)):
        input_ids[i, p - len(prompt) : p] = torch.tensor(prompt)
        input_ids[i, p : p + n] = torch.randint(100, tokenizer.vocab_size - 1, (n,), generator=gen)
        attention[i, p - len(prompt) : p + n] = 1
        response_mask[i, :model_tokens] = 1
        response_mask[i, n - 16 : n] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    response_mask = response_mask * attention[:, p:]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        response_ids=input_ids[:, p:],
        response_mask=response_mask,
        rollout_logprobs=torch.zeros((b, t)),
        uids=data.uids,
        data_sources=data.data_sources,
        loss_mask=response_mask,
    )


def to_device(batch: TrainBatch, device: torch.device | str) -> TrainBatch:
    """The batch with every tensor field on ``device``."""
    moved = {f.name: getattr(batch, f.name) for f in fields(batch)}
    return batch.replace(**{k: v.to(device) for k, v in moved.items() if isinstance(v, torch.Tensor)})


def _synchronize(batch: TrainBatch) -> None:
    """Wait for the batch's device (a GPU runs asynchronously; timings must include its work)."""
    if batch.input_ids.is_cuda:
        torch.cuda.synchronize(batch.input_ids.device)


def update(model, optimizer, batch: TrainBatch, mini: int, share: bool) -> float:
    """Seconds of one update over ``batch`` (on the batch's device): mini-batches of ``mini`` samples, micro-batches
    of 1, an AdamW step per mini-batch."""
    _synchronize(batch)
    start = time.perf_counter()
    model.train()
    for part in batch.split_by_size(mini):
        optimizer.zero_grad(set_to_none=True)
        shared = SharedPrompts(model, part, grad=True) if share else None
        for micro in part.split_by_size(1):
            lp, _ = response_logprobs(model, micro, 1.0, only=micro.loss_mask, shared=shared)
            mask = micro.loss_mask.float()
            (-(lp * mask).sum() / max(float(mask.sum()), 1.0)).backward()
        if shared is not None:
            shared.backward()
        optimizer.step()
    _synchronize(batch)
    return time.perf_counter() - start


def logprobs(model, batch: TrainBatch, share: bool) -> float:
    """Seconds of one no-grad log-prob pass over ``batch`` (micro-batches of 2)."""
    _synchronize(batch)
    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        shared = SharedPrompts(model, batch, grad=False) if share else None
        for micro in batch.split_by_size(2):
            response_logprobs(model, micro, 1.0, only=micro.loss_mask, shared=shared)
    _synchronize(batch)
    return time.perf_counter() - start


def alternating_medians(
    rows: dict[str, Callable[[], tuple[float, float]]], repeats: int
) -> dict[tuple[str, str], float]:
    """Median (update, log-prob pass) seconds of each row: ``rows[name]()`` times both once; the rows run in turn,
    in reverse order every other repeat, so that drift in the machine's speed hits all of them. Keys:
    ``("update" | "logprob", name)``."""
    names = list(rows)
    times: dict[tuple[str, str], list[float]] = {(k, n): [] for k in ("update", "logprob") for n in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            update_s, logprob_s = rows[name]()
            times["update", name].append(update_s)
            times["logprob", name].append(logprob_s)
            print(f"repeat {r + 1} {name}: update {update_s:.1f} s, log-probs {logprob_s:.1f} s", flush=True)
    return {k: statistics.median(v) for k, v in times.items()}


def add_batch_arguments(ap: argparse.ArgumentParser, model: str, response_tokens: int) -> None:
    """The model, adapter and batch options this script and ``step_roofline_bench.py`` share."""
    ap.add_argument("--model", default=model)
    ap.add_argument("--lora-rank", type=int, default=16, help="0 = full fine-tuning")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--mini", type=int, default=8, help="samples per optimizer step (whole groups)")
    ap.add_argument("--response-tokens", type=int, default=response_tokens, help="mean response length")
    ap.add_argument("--model-tokens", type=int, default=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_batch_arguments(ap, "runs/l14/sft/global_step_12/actor", 345)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    if args.lora_rank:
        model = apply_lora(model, args.lora_rank, 2 * args.lora_rank, "all-linear")
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-12)
    batch = build_batch(tokenizer, args.prompts, args.samples, args.response_tokens, args.model_tokens, seed=0)
    prompt_tokens = int(batch.attention_mask[:, : batch.prompt_length].sum())
    total = int(batch.attention_mask.sum())
    print(f"batch: {len(batch)} samples, {total} tokens, of them {prompt_tokens} prompt tokens")
    update(model, optimizer, batch, args.mini, False)  # warm-up: allocator, thread pools
    med = alternating_medians(
        {
            name: lambda share=share: (
                update(model, optimizer, batch, args.mini, share),
                logprobs(model, batch, share),
            )
            for name, share in (("plain", False), ("shared", True))
        },
        args.repeats,
    )
    print(
        f"update: {med['update', 'plain']:.1f} s -> {med['update', 'shared']:.1f} s shared "
        f"({1 - med['update', 'shared'] / med['update', 'plain']:.0%} less); log-prob pass: "
        f"{med['logprob', 'plain']:.1f} s -> {med['logprob', 'shared']:.1f} s "
        f"({1 - med['logprob', 'shared'] / med['logprob', 'plain']:.0%} less)"
    )
    print(
        f"shared_prompts_bench update_s={med['update', 'plain']:.1f}->{med['update', 'shared']:.1f} "
        f"logprob_s={med['logprob', 'plain']:.1f}->{med['logprob', 'shared']:.1f}"
    )


if __name__ == "__main__":
    main()
