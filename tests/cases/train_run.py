"""`train_run OUT.json CONFIG [a.b=value ...]` (tests/dist/trainer/test_e2e.py): a few RL steps, then report
(rank 0 writes JSON): metrics per step, whether every trainable parameter changed on every rank, and finiteness."""
import json
import math

import torch
import torch.distributed as dist

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train


def snapshot(roles) -> dict:
    return {f"{name}.{k}": p.detach().clone() for name, s in roles.trainable().items()
            for k, p in s.module.named_parameters() if p.requires_grad}


def plan_mismatches(cfg, run) -> list[tuple]:
    """This rank's trained roles whose parameter count differs from the memory plan's (rlhf_mcore.plan.params)."""
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.plan.params import Shape, rank_params

    shape, p, pp_rank = Shape.of(load_hf_config(cfg.model)), cfg.parallel, run.ctx.pp_rank
    found = []
    for name, state in run.roles.trainable().items():
        built = sum(t.numel() for t in state.module.parameters())
        planned = rank_params(shape, p.tp, p.pp, p.ep, pp_rank, lm_head=name == "actor")
        if built != planned:
            found.append((dist.get_rank(), name, built, planned))
    return found


def main(out_path: str, config: str, *overrides: str) -> None:
    cfg = load_config(config, list(overrides), world_size=int(__import__("os").environ["WORLD_SIZE"]))
    before = {}

    import rlhf_mcore.trainer.loop as trainer_mod

    original = trainer_mod.start_run

    def start_and_snapshot(c):
        run = original(c)
        before.update(snapshot(run.roles))
        return run

    trainer_mod.start_run = start_and_snapshot
    try:
        run = train(cfg)
    finally:
        trainer_mod.start_run = original  # the next case of a multi-case launch patches it afresh
    after = snapshot(run.roles)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, unchanged)
    off_plan = [None] * dist.get_world_size()  # (rank, role, built, planned) where the memory plan's count is off
    dist.all_gather_object(off_plan, plan_mismatches(cfg, run))
    if dist.get_rank() == 0:
        steps = [m for m in run.history if "critic/score/mean" in m]
        result = {"unchanged": sorted({k for part in gathered for k in part}), "num_params": len(before),
                  "trained_roles": sorted({k.split(".")[0] for k in before}),
                  "off_plan": [m for part in off_plan for m in part],
                  "params_by_role": {r: sum(k.startswith(r + ".") for k in before) for r in ("actor", "critic")},
                  "roles": sorted(name for name in ("actor", "critic", "ref", "reward")
                                  if getattr(run.roles, name) is not None),
                  "metrics": steps, "finite": all(math.isfinite(v) for m in steps for v in m.values()),
                  "validations": [m for m in run.history if any(k.startswith("val-core/") for k in m)]}
        with open(out_path, "w") as f:
            json.dump(result, f)
    from rlhf_mcore.parallel import destroy_distributed

    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
