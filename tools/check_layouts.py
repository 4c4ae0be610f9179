"""Check that a parallel layout gives the same numbers as another: the core promise of rlhf-mcore.

    torchrun --nproc_per_node 4 -m tools.check_layouts --config configs/tiny_grpo.yaml --layouts 1x1,2x1,1x2,2x2
    torchrun --nproc_per_node 4 -m tools.check_layouts --config configs/tiny_moe_grpo.yaml --layouts 1x1,1x1x2,2x1x2

Layouts are TPxPP or TPxPPxEP (EP: an MoE model's experts split over ep of a stage's TP x DP ranks); DP fills
the rest of the world. An MoE layout at tp > 1 runs with sequence parallelism (megatron's MoE layer needs it).
With --packing on every layout runs packed micro-batches (data.use_sequence_packing), with --packing both each
layout runs padded and then packed, all compared against the first (padded) one. Micro-batches are the trainer's
(`phases.micro_batching`): packed ones under --max-tokens, or the config's budget (0 = auto,
`packing.token_budget`). At each layout the same batch goes through the actor
(forward-only log-probs, then a PPO forward + backward + optimizer step) and the critic (value
loss forward + backward + step; --steps N takes N steps on that batch, so LoRA's A matrices, whose first
gradient is zero, are compared too). Per layout it prints loss, grad norm and the max abs difference of
per-token log-probs / values (before and after the steps) against the first layout, and exits 1 when a
relative difference passes --tolerance. Overrides such as model.lora_rank=8 apply to every layout. A vision LM
(configs/tiny_vlm_grpo.yaml) gets one synthetic image per row (`tools/layout_images.py`): the tower, the image rows
and the M-RoPE positions are checked at every layout too.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from functools import partial

import torch

from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.config.schema import ep_fits
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.lora import LoraSettings
from rlhf_mcore.models.registry import language_config
from rlhf_mcore.models.spec import num_experts
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env
from rlhf_mcore.trainer.losses import actor_loss, critic_loss
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.phases import gather_dp, micro_batching
from rlhf_mcore.trainer.roles import attach_run_tower
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches, to_device
from tools.layout_images import add_images, is_vision_lm, text_vocab


def synthetic_batch(num: int, seq: int, vocab: int, seed: int) -> dict:
    """A fixed batch of variable-length sequences with response masks, advantages and returns."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq // 2, seq + 1, (num,), generator=g)
    prompt = torch.randint(2, seq // 3 + 1, (num,), generator=g)
    pos = torch.arange(seq).unsqueeze(0)
    valid = pos < lengths.unsqueeze(1)
    return {
        "tokens": torch.randint(0, vocab, (num, seq), generator=g) * valid,
        "lengths": lengths,
        "response_mask": (valid & (pos >= prompt.unsqueeze(1))).float(),
        "advantages": torch.randn(num, seq, generator=g),
        "returns": torch.randn(num, seq, generator=g),
        "values": torch.zeros(num, seq),  # critic values at rollout time (value clipping)
        "nudge": torch.randn(num, seq, generator=g),  # old log-probs = current ones + 0.1 * nudge
    }


def dp_shard(batch: dict, ctx) -> dict:
    per = batch["tokens"].size(0) // ctx.dims.dp
    return {k: v[ctx.dp_rank * per:(ctx.dp_rank + 1) * per] for k, v in batch.items()}


def run_role(role, cfg, hf, ctx, batch, section, loss_fn, key, split: dict, steps: int = 1):
    """(global loss, grad norm of the last step, per-token output before the steps, after them) for one role."""
    lora = LoraSettings.from_model_cfg(cfg.model, rank=cfg.critic.lora_rank) if role == "critic" else "model"
    model = build_model(role, hf, cfg.model, cfg.parallel, ctx, lora=lora)
    attach_run_tower(model, cfg, hf, ctx)  # a vision LM's tower (the same weights at every layout); text: nothing
    state = build_train_state(model, section.optim, cfg.parallel)  # model.lora_* for the actor, critic.lora_rank
    model = state.module
    fn = partial(loss_fn, model=model, tp_group=ctx.pgs.tp, actor_cfg=section, temperature=1.0,
                 norm_length=float(batch["tokens"].size(1))) if role == "actor" else \
        partial(loss_fn, cliprange_value=section.cliprange_value)
    mbs = split_micro_batches(batch, **split)
    seq = batch["tokens"].size(1)
    before = forward_collect(state.model, mbs, fn, (key,), seq, ctx.pgs.pp)[key]
    if role == "actor":  # old policy = current one, nudged, so the ratio and clipping are exercised
        batch = {**batch, "old_logp": before + 0.1 * batch["nudge"] * batch["response_mask"]}
        mbs = split_micro_batches(batch, **split)
    for _ in range(steps):
        zero_grads(state)
        outputs = run_schedule(state.model, mbs, fn, forward_only=False)
        _, grad_norm = optimizer_step(state, section.optim.lr)
    loss = reduce_outputs(outputs, ctx)[f"{role}/loss"]
    after = forward_collect(state.model, mbs, fn, (key,), seq, ctx.pgs.pp)[key]
    mask = batch["response_mask"]
    return loss, grad_norm, gather_dp(before * mask, ctx), gather_dp(after * mask, ctx)


def parse_layouts(text: str, packing: str) -> list[tuple[int, int, int, bool]]:
    """'1x1,2x1x2' -> [(tp, pp, ep, packed), ...]; --packing both gives each layout padded, then packed.

    >>> parse_layouts("1x1,2x1x2", "both")
    [(1, 1, 1, False), (1, 1, 1, True), (2, 1, 2, False), (2, 1, 2, True)]
    """
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[packing]
    layouts = []
    for item in text.split(","):
        dims = [int(x) for x in item.lower().split("x")]
        if len(dims) not in (2, 3):
            raise ValueError(f"--layouts: {item!r} is not TPxPP or TPxPPxEP. Write e.g. 2x1 or 1x1x2.")
        layouts += [(dims[0], dims[1], dims[2] if len(dims) == 3 else 1, packed) for packed in modes]
    return layouts


def expert_count(hf: dict) -> int:
    """The experts of config.json's language model (a vision LM nests its fields under text_config); 0: dense."""
    return num_experts(language_config(hf))


def is_moe(hf: dict) -> bool:
    return expert_count(hf) > 0


def layout_errors(hf: dict, layouts: list[tuple[int, int, int, bool]], world: int) -> list[str]:
    """One line per layout the model or the world cannot take (EP on a dense model or not dividing the
    experts, a world not divisible by tp*pp or by pp*ep), before any model is built."""
    experts, errs = expert_count(hf), []
    for tp, pp, ep, _ in dict.fromkeys(layouts):
        name = f"{tp}x{pp}x{ep}"
        if ep > 1 and (not experts or experts % ep):
            errs.append(f"--layouts: {name}: ep={ep} must divide the expert count (got {experts or 'a dense model'})."
                        " Use an MoE config and a divisor of its num_experts.")
        if world % (tp * pp) or not ep_fits(world, tp, pp, ep):
            errs.append(f"--layouts: {name}: tp*pp = {tp * pp} and pp*ep = {pp * ep} must divide the world size "
                        f"{world}. Launch a multiple of both.")
    return errs


def check_layout(cfg, layout: tuple[int, int, int, bool], seed: int, num: int, seq: int, max_tokens: int,
                 steps: int = 1) -> dict:
    tp, pp, ep, packed = layout
    hf = load_hf_config(cfg.model)
    # sequence parallelism splits over TP ranks only; an MoE model at tp > 1 needs it
    sp = (cfg.parallel.sequence_parallel or is_moe(hf)) and tp > 1
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tp=tp, pp=pp, ep=ep,
                                                                sequence_parallel=sp))
    reset_model_parallel()
    ctx = init_distributed(tp, pp, seed=seed, ep=ep)
    batch = synthetic_batch(num, seq, text_vocab(hf), seed)
    batch = add_images(batch, hf, seed) if is_vision_lm(hf) else batch  # a vision LM: an image opens each row
    batch = to_device(dp_shard(batch, ctx), ctx.device)
    result = {"layout": f"tp{tp} pp{pp}{f' ep{ep}' if ep > 1 else ''} dp{ctx.dims.dp}{' sp' if sp else ''}"
                        f"{' packed' if packed else ''}"}
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, use_sequence_packing=packed))
    if max_tokens:
        cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, max_tokens_per_gpu=max_tokens))
    for role, section, fn, key in (("actor", cfg.actor, actor_loss, "logp"),
                                   ("critic", cfg.critic, critic_loss, "values")):
        loss, norm, before, after = run_role(role, cfg, hf, ctx, batch, section, fn, key,
                                             micro_batching(cfg, section), steps)  # the trainer's micro-batches
        result.update({f"{role}_loss": loss, f"{role}_grad_norm": norm, f"{role}_before": before,
                       f"{role}_after": after})
    return result


def compare(results: list[dict], tol: float) -> tuple[list[str], bool]:
    ref, ok, lines = results[0], True, []
    header = f"{'layout':<27}{'actor loss':>14}{'actor gnorm':>14}{'logp diff':>11}{'logp diff*':>11}" \
             f"{'critic loss':>14}{'critic gnorm':>14}{'value diff':>11}{'value diff*':>12}"
    lines.append(header)
    for r in results:
        diffs = {k: float((r[k] - ref[k]).abs().max()) for k in
                 ("actor_before", "actor_after", "critic_before", "critic_after")}
        for k in ("actor_loss", "actor_grad_norm", "critic_loss", "critic_grad_norm"):
            ok &= abs(r[k] - ref[k]) <= tol * max(1.0, abs(ref[k]))
        ok &= all(d <= tol * 10 for d in diffs.values())
        lines.append(f"{r['layout']:<27}{r['actor_loss']:>14.8f}{r['actor_grad_norm']:>14.8f}"
                     f"{diffs['actor_before']:>11.2e}{diffs['actor_after']:>11.2e}{r['critic_loss']:>14.8f}"
                     f"{r['critic_grad_norm']:>14.8f}{diffs['critic_before']:>11.2e}{diffs['critic_after']:>12.2e}")
    lines.append("(* = after the optimizer steps; diffs are max abs vs the first layout)")
    moved = {k: float((ref[f"{k}_after"] - ref[f"{k}_before"]).abs().max()) for k in ("actor", "critic")}
    lines.append(f"moved by the steps (first layout): actor logp {moved['actor']:.2e}, values {moved['critic']:.2e}")
    return lines, ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--layouts", default="1x1,2x1,1x2,2x2", help="comma-separated TPxPP or TPxPPxEP")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="relative tolerance (fp32 on CPU: 1e-5)")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps on the batch (each role)")
    parser.add_argument("--sequence-parallel", action="store_true", help="sequence parallelism where tp > 1")
    parser.add_argument("--packing", choices=("off", "on", "both"), default="off",
                        help="packed micro-batches (sequence packing): off, on, or both at every layout")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="token budget of a packed micro-batch (0: the config's actor.max_tokens_per_gpu, "
                             "whose 0 is auto: micro_batch_size_per_gpu x the longest row)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    rank, _, world = torchrun_env()
    init_logger(rank)
    try:
        layouts = parse_layouts(args.layouts, args.packing)
        cfg = load_config(args.config, args.overrides)
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel,
                                                                    sequence_parallel=args.sequence_parallel))
        errors = layout_errors(load_hf_config(cfg.model), layouts, world)
    except (ConfigError, ValueError) as e:
        errors = [str(e)]
    if errors:
        if rank == 0:
            print("\n".join(errors), file=sys.stderr)
        return 2
    results = [check_layout(cfg, layout, args.seed, args.num_samples, args.seq_len, args.max_tokens, args.steps)
               for layout in layouts]
    lines, ok = compare(results, args.tolerance)
    if rank == 0:
        print("\n".join(lines))
        print("PASS" if ok else f"FAIL: a difference passed the tolerance {args.tolerance}")
    destroy_distributed()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
