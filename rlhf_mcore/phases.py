"""The phases of one RL step, each one function the trainer calls under a timer.

A step batch is a dict of this DP rank's samples; every per-token tensor is [B, S] and aligned with
`tokens` (S = max prompt + max response length, the same on every rank): x[:, t] belongs to token t.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlhf_mcore.algorithms import ADVANTAGES, AdvantageInputs, apply_kl_penalty, compute_mismatch_weights
from rlhf_mcore.logs import heartbeat, progress
from rlhf_mcore.optim import optimizer_step, zero_grads
from rlhf_mcore.role_losses import actor_loss, critic_loss, reward_model_scores
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.schedule import forward_collect, run_schedule, split_micro_batches, take


def sampling_params(cfg, eos_ids: tuple[int, ...], step: int, validation: bool = False) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        n=1 if validation else r.n, max_new_tokens=r.max_response_length,
        temperature=r.val_temperature if validation else r.temperature,
        top_p=1.0 if validation else r.top_p, top_k=-1 if validation else r.top_k,
        stop_token_ids=eos_ids, stop_strings=tuple(r.stop), seed=cfg.trainer.seed * 1_000_003 + step,
    )


def greedy_baseline(engine, scorer, prompts, cfg, stop_ids, step: int) -> torch.Tensor:
    """[P * n] reward of one greedy rollout per prompt, repeated for each of its n samples (ReMax)."""
    greedy = engine.generate([list(p.prompt_ids) for p in prompts],
                             sampling_params(cfg, stop_ids, step, validation=True))
    scores, _ = scorer(greedy, prompts, 1)
    return scores.repeat_interleave(cfg.rollout.n)


def decode_responses(rollout: RolloutBatch, decode) -> list[str]:
    starts, lengths = rollout.prompt_lengths.tolist(), rollout.response_lengths.tolist()
    return [decode(row[s:s + n]) for row, s, n in zip(rollout.tokens.tolist(), starts, lengths)]


def make_batch(rollout: RolloutBatch, scores: torch.Tensor, group_index: torch.Tensor, seq_len: int) -> dict:
    """RolloutBatch + sequence scores [B] -> the step batch (per-token fields padded to seq_len)."""
    pad = seq_len - rollout.tokens.size(1)
    mask = F.pad(rollout.response_mask, (0, pad)).float()
    lengths = rollout.total_lengths
    last = (lengths - 1).clamp(min=0)
    token_scores = torch.zeros_like(mask)
    rows = torch.arange(mask.size(0), device=mask.device)
    token_scores[rows, last] = scores.to(mask.dtype) * (rollout.response_lengths > 0)
    return {
        "tokens": F.pad(rollout.tokens, (0, pad)), "lengths": lengths, "response_mask": mask,
        "rollout_logp": F.pad(rollout.rollout_logprobs.float(), (0, pad)), "token_level_scores": token_scores,
        "group_index": group_index, "response_lengths": rollout.response_lengths,
        "prompt_lengths": rollout.prompt_lengths,
    }


def seq_multiple(cfg) -> int:
    """Micro-batch sequence lengths are padded to this: sequence parallelism splits them over TP."""
    return cfg.parallel.tp if cfg.parallel.sequence_parallel else 1


def forward_passes(roles, batch: dict, cfg, ctx) -> dict:
    """Forward-only passes: old log-probs (actor), reference log-probs, values (critic), RM scores."""
    seq = batch["tokens"].size(1)
    mbs = split_micro_batches(batch, cfg.actor.micro_batch_size_per_gpu,
                              cfg.actor.max_tokens_per_gpu if cfg.actor.use_dynamic_bsz else 0, seq_multiple(cfg))
    lm = partial(actor_loss, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=cfg.rollout.temperature,
                 norm_length=float(cfg.rollout.max_response_length))
    with heartbeat(f"log-prob passes ({len(mbs)} micro-batches)", enabled=ctx.is_logging_rank):
        return _forward_passes(roles, mbs, lm, seq, cfg, ctx)


def _forward_passes(roles, mbs: list, lm, seq: int, cfg, ctx) -> dict:
    out = {"old_logp": forward_collect(roles.actor.model, mbs, partial(lm, model=roles.actor.module), ("logp",),
                                       seq, ctx.pgs.pp)["logp"]}
    if roles.ref is not None:
        out["ref_logp"] = forward_collect([roles.ref], mbs, partial(lm, model=roles.ref), ("logp",), seq,
                                          ctx.pgs.pp)["logp"]
    if roles.critic is not None:
        fn = partial(critic_loss, cliprange_value=cfg.critic.cliprange_value)
        out["values"] = forward_collect(roles.critic.model, mbs, fn, ("values",), seq, ctx.pgs.pp)["values"]
    return out


def reward_model_pass(roles, batch: dict, cfg, ctx) -> torch.Tensor:
    """[B, S] reward-model scores at each sequence's last token."""
    mbs = split_micro_batches(batch, cfg.actor.micro_batch_size_per_gpu, multiple=seq_multiple(cfg))
    return forward_collect([roles.reward], mbs, reward_model_scores, ("scores",), batch["tokens"].size(1),
                           ctx.pgs.pp)["scores"]


def gather_dp(t: torch.Tensor, ctx) -> torch.Tensor:
    """Concatenate a per-sample tensor over the DP group (rank order)."""
    if ctx.dims.dp == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(ctx.dims.dp)]
    dist.all_gather(parts, t.contiguous(), group=ctx.pgs.dp)
    return torch.cat(parts)


def compute_advantages(batch: dict, cfg, kl_coef: float, ctx) -> tuple[dict, dict]:
    """Token rewards (with the KL penalty when it goes in the reward) and advantages, computed on the
    whole global batch (gathered over DP) so whitening and group statistics never depend on the layout."""
    metrics = {}
    rewards = batch["token_level_scores"]
    if cfg.algorithm.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(rewards, batch["old_logp"], batch["ref_logp"], batch["response_mask"],
                                               kl_coef, cfg.algorithm.kl_penalty)
        metrics.update({f"actor/reward_{k}": v for k, v in kl_metrics.items()})
    full = {k: gather_dp(v, ctx) for k, v in (("rewards", rewards), ("mask", batch["response_mask"]),
                                              ("group", batch["group_index"]))}
    values = gather_dp(batch["values"], ctx) if "values" in batch else None
    baseline = gather_dp(batch["baseline_rewards"], ctx) if "baseline_rewards" in batch else None
    a = cfg.algorithm
    adv, returns = ADVANTAGES.get(a.adv_estimator)(AdvantageInputs(
        token_level_rewards=full["rewards"], response_mask=full["mask"], values=values, group_index=full["group"],
        baseline_rewards=baseline, gamma=a.gamma, lam=a.lam, norm_adv_by_std=a.norm_adv_by_std))
    b = batch["tokens"].size(0)
    mine = slice(ctx.dp_rank * b, (ctx.dp_rank + 1) * b)
    return {**batch, "token_level_rewards": rewards, "advantages": adv[mine], "returns": returns[mine]}, metrics


def rollout_correction(batch: dict, actor_cfg) -> tuple[dict, dict]:
    """Importance weights between the rollout engine's log-probs and the trainer's (mismatch metrics too)."""
    weights, metrics = compute_mismatch_weights(
        batch["old_logp"], batch["rollout_logp"], batch["response_mask"],
        level=actor_cfg.rollout_correction if actor_cfg.rollout_correction != "none" else "token",
        mode=actor_cfg.rollout_correction_mode, threshold=actor_cfg.rollout_correction_threshold)
    metrics = {f"rollout/{k}": v for k, v in metrics.items()}
    if actor_cfg.rollout_correction == "none":
        return batch, metrics
    return {**batch, "is_weights": weights}, metrics


def update_role(name: str, state, batch: dict, loss_fn, section, rows_per_mini: int, lr: float,
                multiple: int = 1) -> list[dict]:
    """ppo_epochs x mini-batches of forward-backward over micro-batches, one optimizer step each.
    Returns the loss functions' reports plus one {"<name>/grad_norm"} per optimizer step."""
    rows = batch["tokens"].size(0)
    budget = section.max_tokens_per_gpu if getattr(section, "use_dynamic_bsz", False) else 0
    reports = []
    num_steps = section.ppo_epochs * -(-rows // rows_per_mini)
    with progress(num_steps, f"update_{name}", dist.get_rank() == 0, unit="optimizer steps") as bar:
        for _ in range(section.ppo_epochs):
            for start in range(0, rows, rows_per_mini):
                mbs = split_micro_batches(take(batch, slice(start, start + rows_per_mini)),
                                          section.micro_batch_size_per_gpu, budget, multiple)
                zero_grads(state)
                reports += run_schedule(state.model, mbs, loss_fn, forward_only=False)
                _, grad_norm = optimizer_step(state, lr)
                reports.append({f"{name}/grad_norm": torch.tensor(grad_norm)})
                bar.update(1)
    return reports
