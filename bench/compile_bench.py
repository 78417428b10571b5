"""Does ``torch.compile`` make the actor's passes cheaper on this CPU? The update and the log-prob pass, eager and
compiled, on ``bench/shared_prompts_bench.py``'s batch.

A lever for issue 14's step target: in ``bench/step_roofline_bench.py``'s profile the update spends 15% of its time in
``mul`` and 6% in ``add`` (norms, the SwiGLU gate, rotary embeddings, LoRA's scale), element-wise work that inductor
fuses. Two models are loaded from the same weights; one has each decoder layer compiled (``--scope layers``) or only
each layer's MLP (``--scope mlp``), with dynamic shapes since every micro-batch has another length. Rows alternate
(eager, compiled, compiled, eager, ...) so that drift in the machine's speed hits both; compilation happens in a
warm-up that is not timed.

``--scope layers`` runs the plain passes (each sample encodes its prompt): with ``SharedPrompts`` the layers read a
KV cache whose per-layer index dynamo specialises on, so it recompiles per layer and falls back to eager after its
recompile limit. ``--scope mlp`` runs the trainer's default, shared prompts.

    python bench/compile_bench.py --model runs/l14/sft384/global_step_12/actor --response-tokens 364 --scope layers

Last line: ``compile_bench scope=<scope> update_s=<eager>-><compiled> logprob_s=<eager>-><compiled>``.
"""

from __future__ import annotations

import argparse

import torch
from shared_prompts_bench import add_batch_arguments, alternating_medians, build_batch, logprobs, update
from torch import nn

from search_rl.models import load_model, load_tokenizer
from search_rl.models.lora import apply_lora


def build(path: str, lora_rank: int, scope: str | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The policy (with LoRA when ``lora_rank``), its decoder layers or their MLPs compiled when ``scope`` is set."""
    model = load_model(path)
    if lora_rank:
        model = apply_lora(model, lora_rank, 2 * lora_rank, "all-linear")
    if scope is not None:
        for layer in model.get_decoder().layers:
            (layer if scope == "layers" else layer.mlp).compile(dynamic=True)
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-12)
    return model, optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_batch_arguments(ap, "runs/l14/sft384/global_step_12/actor", 364)
    ap.add_argument("--scope", choices=("layers", "mlp"), default="layers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    share = args.scope == "mlp"
    tokenizer = load_tokenizer(args.model)
    models = {
        name: build(args.model, args.lora_rank, scope) for name, scope in (("eager", None), ("compiled", args.scope))
    }
    batch = build_batch(tokenizer, args.prompts, args.samples, args.response_tokens, args.model_tokens, seed=0)
    print(f"batch: {len(batch)} samples, {int(batch.attention_mask.sum())} tokens; shared prompts: {share}")
    for name, (model, optimizer) in models.items():  # warm-up: compilation, allocator, thread pools
        print(f"warm-up {name}: update {update(model, optimizer, batch, args.mini, share):.1f} s", flush=True)
        logprobs(model, batch, share)
    med = alternating_medians(
        {
            name: lambda model=model, optimizer=optimizer: (
                update(model, optimizer, batch, args.mini, share),
                logprobs(model, batch, share),
            )
            for name, (model, optimizer) in models.items()
        },
        args.repeats,
    )
    print(
        f"compile_bench scope={args.scope} update_s={med['update', 'eager']:.1f}->{med['update', 'compiled']:.1f} "
        f"logprob_s={med['logprob', 'eager']:.1f}->{med['logprob', 'compiled']:.1f}"
    )


if __name__ == "__main__":
    main()
