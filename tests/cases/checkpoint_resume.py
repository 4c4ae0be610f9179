"""torchrun worker of tests/dist/checkpoint/test_resume_dist.py (gloo, 2 ranks). Prints `RESULT <json>` on rank 0.

    torchrun --nproc_per_node 2 -m tests.worker checkpoint_resume --phase train --out DIR
    torchrun --nproc_per_node 2 -m tests.worker checkpoint_resume --phase resume --out DIR

train:  per case (layout x optimizer): 2 PPO steps, save, record RNG draws and forward log-probs,
        2 more steps, record losses and this rank's parameters (the "4 steps straight" reference).
resume: (a fresh process) per case: fresh model, load, then the same RNG draws, losses and parameters
        must come out bitwise equal. Across layouts: weights give the same forward (1e-6) and optimizer
        state resumes training to fp32 tolerance. Last, a save killed mid-way (os._exit once the role
        checkpoints are written) must leave the step-2 checkpoint in place.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import random
from functools import partial
from pathlib import Path

import numpy as np
import torch

import rlhf_mcore.checkpoint.save_load as save_load
from rlhf_mcore.checkpoint import find_latest, load_checkpoint, load_model_weights, save_checkpoint
from rlhf_mcore.checkpoint.optim_state import adam_steps
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed, reset_model_parallel
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches, to_device
from tests.support.tiny import tiny_model_config
from tools.check_layouts import dp_shard, gather_dp, synthetic_batch

# name -> (tp, pp, use_distributed_optimizer); dp fills the 2 ranks
CASES = {"dp2": (1, 1, False), "dp2_distopt": (1, 1, True), "tp2": (2, 1, False), "pp2_distopt": (1, 2, True)}
# (saved case, layout to load at): weights -> same forward; optimizer -> training continues (fp32 tolerance)
CROSS = [("tp2", (1, 1, False)), ("pp2_distopt", (1, 1, True)), ("dp2_distopt", (2, 1, True)),
         ("dp2", (1, 2, False))]
NUM, SEQ, SEED = 8, 16, 1234


def setup(tp: int, pp: int, distopt: bool):
    cfg = tiny_model_config()
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tp=tp, pp=pp,
                                                                   use_distributed_optimizer=distopt))
    cfg.actor.optim.lr = 1e-3
    reset_model_parallel()
    ctx = init_distributed(tp, pp, seed=SEED)
    hf = load_hf_config(cfg.model)
    state = build_train_state(build_model("actor", hf, cfg.model, cfg.parallel, ctx), cfg.actor.optim, cfg.parallel)
    return cfg, ctx, hf, state


def batch_for(step: int, ctx, vocab: int) -> dict:
    batch = dp_shard(synthetic_batch(NUM, SEQ, vocab, seed=100 + step), ctx)
    batch["old_logp"] = -math.log(vocab) + 0.1 * batch["nudge"] * batch["response_mask"]
    return to_device(batch, ctx.device)


def loss_fn(cfg, ctx, state):
    return partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                   norm_length=float(SEQ))


def train(cfg, ctx, hf, state, steps) -> list[float]:
    losses = []
    for step in steps:
        mbs = split_micro_batches(batch_for(step, ctx, hf["vocab_size"]), cfg.actor.micro_batch_size_per_gpu)
        zero_grads(state)
        outputs = run_schedule(state.model, mbs, loss_fn(cfg, ctx, state), forward_only=False)
        optimizer_step(state, cfg.actor.optim.lr)
        losses.append(reduce_outputs(outputs, ctx)["actor/loss"])
    return losses


def forward_logp(cfg, ctx, hf, state) -> torch.Tensor:
    """Per-token log-probs [NUM, SEQ] of a fixed batch, gathered over DP (the same on every rank)."""
    batch = batch_for(999, ctx, hf["vocab_size"])
    mbs = split_micro_batches(batch, cfg.actor.micro_batch_size_per_gpu)
    logp = forward_collect(state.model, mbs, loss_fn(cfg, ctx, state), ("logp",), SEQ, ctx.pgs.pp)["logp"]
    return gather_dp(logp * batch["response_mask"], ctx)


def rng_draws() -> list:
    return [torch.rand(3).tolist(), random.random(), float(np.random.rand())]


def params(state) -> dict:
    return {k: v.detach().clone() for k, v in state.module.named_parameters()}


def phase_train(out: Path) -> dict:
    result = {}
    for name, layout in CASES.items():
        cfg, ctx, hf, state = setup(*layout)
        first = train(cfg, ctx, hf, state, range(2))
        save_checkpoint(out / name, 2, {"actor": state}, {"step": 2, "losses": first}, ctx, keep=2)
        draws = rng_draws()
        logp = forward_logp(cfg, ctx, hf, state)
        rest = train(cfg, ctx, hf, state, range(2, 4))
        torch.save({"params": params(state), "draws": draws, "logp": logp, "losses": first + rest},
                   out / name / f"reference_rank{ctx.rank}.pt")
        result[name] = first + rest
    return result


def resume_case(out: Path, name: str) -> dict:
    cfg, ctx, hf, state = setup(*CASES[name])
    ref = torch.load(out / name / f"reference_rank{ctx.rank}.pt", map_location=ctx.device, weights_only=True)
    extra = load_checkpoint(find_latest(out / name), {"actor": state}, ctx)
    draws = rng_draws()
    steps = adam_steps(state.optimizer)
    losses = train(cfg, ctx, hf, state, range(2, 4))
    same = all(torch.equal(ref["params"][k], v) for k, v in params(state).items())
    flags = torch.tensor([float(same), float(draws == ref["draws"])], device=ctx.device)
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
    return {"extra": extra, "losses": losses, "ref_losses": ref["losses"][2:], "params_equal": bool(flags[0]),
            "rng_equal": bool(flags[1]), "adam_steps": sorted(steps)}


def cross_case(out: Path, saved: str, layout: tuple) -> dict:
    cfg, ctx, hf, state = setup(*layout)
    path = find_latest(out / saved)
    ref = torch.load(out / saved / "reference_rank0.pt", map_location=ctx.device, weights_only=True)
    load_model_weights(state.module, Path(path) / "actor")  # weights only, like model.load
    weights_diff = (forward_logp(cfg, ctx, hf, state) - ref["logp"]).abs().max().item()
    load_checkpoint(path, {"actor": state}, ctx)  # weights + optimizer state, resharded
    losses = train(cfg, ctx, hf, state, range(2, 4))
    return {"weights_logp_diff": weights_diff, "losses": losses, "ref_losses": ref["losses"][2:],
            "adam_steps": sorted(adam_steps(state.optimizer))}


def killed_save(out: Path) -> None:
    """Die hard (no exception handling, no cleanup) after the role checkpoint of step 3 is written."""
    cfg, ctx, hf, state = setup(*CASES["dp2"])
    load_checkpoint(find_latest(out / "dp2"), {"actor": state}, ctx)
    train(cfg, ctx, hf, state, range(2, 3))

    def die(path):
        torch.distributed.barrier()
        print(f"KILLED rank {ctx.rank}", flush=True)
        # megatron's checkpoint writer keeps a spawned Manager process per rank; a real kill of the job
        # takes it down too, os._exit alone would orphan it (holding our stdout open).
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(17)

    save_load.save_rng_file = die
    save_checkpoint(out / "dp2", 3, {"actor": state}, {"step": 3}, ctx, keep=2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("train", "resume"), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.phase == "train":
        result = phase_train(out)
    else:
        result = {"resume": {name: resume_case(out, name) for name in CASES},
                  "cross": {f"{saved}->tp{t}pp{p}{'_distopt' if d else ''}": cross_case(out, saved, (t, p, d))
                            for saved, (t, p, d) in CROSS}}
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    if args.phase == "resume":
        killed_save(out)
    return 0


def entry(argv: list[str]) -> int:
    return main(argv)
