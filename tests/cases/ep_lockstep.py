"""torchrun worker of tests/dist/trainer/test_ep_lockstep.py (2 ranks, gloo): the tiny MoE preset's actor at EP2 and at
EP1 with a different number of micro-batches per rank (rank 0: 6 rows, rank 1: 2 rows, 2 rows per micro-batch).

    torchrun --nproc_per_node 2 -m tests.worker ep_lockstep OUT.json

Per layout: forward-only log-probs, one PPO update (forward + backward + optimizer step: loss, grad norm), the
log-probs after it. Rank 0 writes {layout: {"loss", "grad_norm", "before": [rank rows], "after": [...]}}.
"""
from __future__ import annotations

import dataclasses
import json
from functools import partial

import torch.distributed as dist

from rlhf_mcore.config.load import load_config
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches
from tools.check_layouts import synthetic_batch

SEQ = 20


def run(cfg, ep: int) -> dict:
    reset_model_parallel()
    ctx = init_distributed(1, 1, seed=1, ep=ep)
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, ep=ep))
    hf = load_hf_config(cfg.model)
    full = synthetic_batch(8, SEQ, hf["vocab_size"], seed=3)
    rows = slice(0, 6) if ctx.rank == 0 else slice(6, 8)
    batch = {k: v[rows] for k, v in full.items()}
    state = build_train_state(build_model("actor", hf, cfg.model, cfg.parallel, ctx), cfg.actor.optim, cfg.parallel)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=float(SEQ))
    mbs = split_micro_batches(batch, micro_batch_size=2)
    before = forward_collect(state.model, mbs, fn, ("logp",), SEQ, ctx.pgs.pp)["logp"]
    batch = {**batch, "old_logp": before + 0.1 * batch["nudge"] * batch["response_mask"]}
    mbs = split_micro_batches(batch, micro_batch_size=2)
    zero_grads(state)
    outputs = run_schedule(state.model, mbs, fn, forward_only=False)
    assert len(outputs) == len(mbs)  # the padding micro-batches' reports are dropped
    _, grad_norm = optimizer_step(state, cfg.actor.optim.lr)
    loss = reduce_outputs(outputs, ctx)["actor/loss"]
    after = forward_collect(state.model, mbs, fn, ("logp",), SEQ, ctx.pgs.pp)["logp"]
    mask = batch["response_mask"]
    mine = {"before": (before * mask).tolist(), "after": (after * mask).tolist()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"loss": loss, "grad_norm": grad_norm, "ranks": everyone}


def main(argv: list[str]) -> int:
    init_logger(torchrun_env()[0])
    cfg = load_config("configs/tiny_moe_grpo.yaml", ["actor.router_replay=disabled"])
    result = {f"ep{ep}": run(cfg, ep) for ep in (2, 1)}
    if dist.get_rank() == 0:
        with open(argv[0], "w") as f:
            json.dump(result, f)
    destroy_distributed()
    return 0


def entry(argv: list[str]) -> int:
    return main(argv)
