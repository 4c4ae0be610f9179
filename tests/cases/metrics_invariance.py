"""`metrics_invariance OUT.json TP PP` (tests/dist/trainer/test_metrics_invariance.py): one tiny GRPO update
(actor only, on-policy: pi_old and the rollout mismatch come from the loss's own forward) and one PPO update
(critic, then actor with old log-probs, batch-level importance weights, a KL loss and an entropy bonus; both roles
aggregate with seq-mean-token-mean: the critic follows actor.loss_agg_mode) at several micro-batch layouts, at the
TP / PP sizes of argv (DP: the rest of the world). Rank 0 writes {recipe: {layout: reduced metrics}} as JSON.

The global batch is fixed; each DP rank takes its share of every mini-batch, so a mini-batch holds the same
rows at any DP size. The learning rate is tiny: the second mini-batch sees (almost) the first one's weights,
so its metrics do not amplify fp32 gradient differences between layouts."""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rlhf_mcore.config.load import load_config
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import destroy_distributed, init_distributed
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.losses import rollout_mismatch
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import build_train_state
from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches

NUM_ROWS, ROWS_PER_MINI, SEQ = 16, 8, 24
# name -> split_micro_batches arguments: padded at 1, 2, 4 rows, packed (a budget, the automatic one), dynamic
LAYOUTS = {
    "mbs1": dict(micro_batch_size=1), "mbs2": dict(micro_batch_size=2), "mbs4": dict(micro_batch_size=4),
    "packed40": dict(micro_batch_size=2, max_tokens=40, pack=True), "packed_auto": dict(micro_batch_size=2, pack=True),
    "dynamic40": dict(micro_batch_size=2, max_tokens=40, dynamic=True),
}
COMMON = ["rollout.n=2", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "actor.optim.lr=1e-9",
          "critic.optim.lr=1e-9", "actor.entropy_coeff=0.01", "actor.rollout_correction=token"]
RECIPES = {
    "grpo": ("tiny_grpo.yaml", ["actor.use_kl_loss=true"]),
    "ppo": ("tiny_ppo.yaml", ["actor.use_kl_loss=true", "actor.clip_ratio_high=0.28",
                              "actor.loss_agg_mode=seq-mean-token-mean"]),  # the critic follows (verl)
}


def global_batch(vocab: int, seed: int = 7) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(SEQ // 3, SEQ + 1, (NUM_ROWS,), generator=g)
    lengths[3] = SEQ
    prompt = torch.randint(2, SEQ // 3, (NUM_ROWS,), generator=g)
    pos = torch.arange(SEQ).unsqueeze(0)
    valid = pos < lengths.unsqueeze(1)
    mask = (valid & (pos >= prompt.unsqueeze(1))).float()
    return {"tokens": torch.randint(1, vocab, (NUM_ROWS, SEQ), generator=g) * valid, "lengths": lengths,
            "response_mask": mask, "advantages": torch.randn(NUM_ROWS, SEQ, generator=g) * mask,
            "returns": torch.randn(NUM_ROWS, SEQ, generator=g) * mask,
            "nudge": torch.randn(NUM_ROWS, 3, SEQ, generator=g) * mask[:, None]}  # log-prob perturbations


def my_rows(dp: int, rank: int) -> torch.Tensor:
    """This rank's share of every mini-batch (contiguous within it), in mini-batch order."""
    per = ROWS_PER_MINI // dp
    return torch.cat([torch.arange(start + rank * per, start + (rank + 1) * per)
                      for start in range(0, NUM_ROWS, ROWS_PER_MINI)])


def build_roles(cfg, ctx, hf, with_critic: bool):
    """Fresh train states (the same weights every call: `build_model` draws from fixed seeds) and loss fns."""
    sections = (("actor", cfg.actor), ("critic", cfg.critic)) if with_critic else (("actor", cfg.actor),)
    states = {role: build_train_state(build_model(role, hf, cfg.model, cfg.parallel, ctx), section.optim,
                                      cfg.parallel) for role, section in sections}
    roles = SimpleNamespace(actor=states["actor"], critic=states.get("critic"), ref=None)
    return roles, phases.build_loss_fns(cfg, ctx, roles)


def rollout_fields(cfg, ctx, hf, batch: dict, with_critic: bool) -> tuple[dict, dict]:
    """The forward-only fields, computed row by row (the same numbers at any layout and DP size): rollout and
    reference log-probs near the actor's, and for PPO old log-probs, rollout-time values (some beyond the clip
    range) and the batch-level IS weights -> (batch, rollout/mismatch_* metrics, as phases.rollout_correction)."""
    roles, losses = build_roles(cfg, ctx, hf, with_critic)
    nudge = batch.pop("nudge")  # [b, 3, S]
    rows = split_micro_batches(batch, micro_batch_size=1)
    logp = forward_collect(roles.actor.model, rows, losses.old_logp, ("logp",), SEQ, ctx.pgs.pp)["logp"]
    batch = {**batch, "rollout_logp": logp + 0.05 * nudge[:, 0], "ref_logp": logp + 0.1 * nudge[:, 1]}
    if not with_critic:  # GRPO on-policy: pi_old and the mismatch come from the update's own forward
        return batch, {}
    values = forward_collect(roles.critic.model, rows, losses.critic, ("values",), SEQ, ctx.pgs.pp)["values"]
    batch.update(values=values + 0.5 * nudge[:, 0], old_logp=logp + 0.1 * nudge[:, 2])
    batch["is_weights"], mismatch = rollout_mismatch(batch["old_logp"], batch["rollout_logp"],
                                                     batch["response_mask"], cfg.actor)
    return batch, mismatch


def update(cfg, ctx, hf, batch: dict, mismatch: dict, split: dict, with_critic: bool) -> dict:
    """One update of the recipe's roles at one micro-batch layout -> the reduced metrics (every rank)."""
    roles, losses = build_roles(cfg, ctx, hf, with_critic)
    rows_per_mini, reports = ROWS_PER_MINI // ctx.dims.dp, []
    if with_critic:
        reports += phases.update_role("critic", roles.critic, batch, losses.critic, cfg.critic, rows_per_mini, 1e-9,
                                      split)
    reports += phases.update_role("actor", roles.actor, batch, losses.actor, cfg.actor, rows_per_mini, 1e-9, split)
    return reduce_outputs([mismatch, *reports], ctx)  # as loop.train_step does


def main(out_path: str, tp: str = "1", pp: str = "1") -> None:
    ctx = init_distributed(int(tp), int(pp), seed=1234)  # DP fills the rest of the world
    results = {}
    for recipe, (config, overrides) in RECIPES.items():
        cfg = load_config(f"configs/{config}", [*COMMON, *overrides, f"parallel.tp={tp}", f"parallel.pp={pp}"],
                          check=False)
        hf = load_hf_config(cfg.model)
        full = global_batch(hf["vocab_size"])
        mine = my_rows(ctx.dims.dp, ctx.dp_rank)
        batch, mismatch = rollout_fields(cfg, ctx, hf, {k: v[mine] for k, v in full.items()}, recipe == "ppo")
        results[recipe] = {name: update(cfg, ctx, hf, batch, mismatch, dict(multiple=1, **split), recipe == "ppo")
                           for name, split in LAYOUTS.items()}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
