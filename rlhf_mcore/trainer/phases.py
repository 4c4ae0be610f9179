"""The phases of one RL step, each one function the trainer calls under a timer: a `StepBatch` in, a
`StepBatch` with the phase's fields filled in out (plus metrics). Forward-only passes and updates cut the
batch into micro-batch dicts (`schedule.split_micro_batches`) for the roles' loss functions.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlhf_mcore.algorithms.advantages import ADVANTAGES, AdvantageInputs, estimator_needs
from rlhf_mcore.algorithms.kl import apply_kl_penalty
from rlhf_mcore.data.packing import ROW_FIELDS, plan_dp_split
from rlhf_mcore.logs import heartbeat, progress, timer
from rlhf_mcore.models.moe_load import moe_update_metrics
from rlhf_mcore.models.routing import RoutingHooks, pad_columns
from rlhf_mcore.rollout.modes.metrics import turn_report
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.trainer.losses import actor_loss, critic_agg_mode, critic_loss, reward_model_scores, rollout_mismatch
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import optimizer_step, zero_grads
from rlhf_mcore.trainer.row_fields import uniform_row_fields
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches, take
from rlhf_mcore.trainer.step_batch import StepBatch

ROUND_SEED_STRIDE = 1_000_033  # a step's generation rounds: distinct seeds, in the low 32 bits (CPU's mt19937)


def sampling_params(cfg, eos_ids: tuple[int, ...], step: int, validation: bool = False,
                    round_index: int = 0) -> SamplingParams:
    """`round_index`: the step's generation round (dynamic sampling draws more prompt batches per step)."""
    r = cfg.rollout
    val_temperature = r.val_temperature if r.val_do_sample else 0.0  # verl's do_sample=False: greedy
    return SamplingParams(
        n=r.val_n if validation else r.n, max_new_tokens=r.max_response_length,
        temperature=val_temperature if validation else r.temperature,
        top_p=r.val_top_p if validation else r.top_p, top_k=r.val_top_k if validation else r.top_k,
        stop_token_ids=eos_ids, stop_strings=tuple(r.stop),
        seed=cfg.trainer.seed * 1_000_003 + step + round_index * ROUND_SEED_STRIDE,
    )


def greedy_baseline(rollout, scorer, prompts, cfg, stop_ids, step: int) -> torch.Tensor:
    """[P * n] reward of one greedy rollout per prompt (through the rollout layer `rollout`, in its mode),
    repeated for each of its n samples (ReMax)."""
    params = replace(sampling_params(cfg, stop_ids, step, validation=True), n=1, temperature=0.0, top_p=1.0, top_k=-1)
    greedy = rollout.generate(prompts, params)
    scores, _ = scorer(greedy, prompts, 1)
    return scores.repeat_interleave(cfg.rollout.n)


def assistant_turns(rollout: RolloutBatch, decode) -> list[list[str]]:
    """Per row of a multi-turn rollout, the text of each assistant turn (decoded on its own)."""
    rows = rollout.tokens.tolist()
    return [[decode(row[a:b]) for a, b in spans] for row, spans in zip(rows, rollout.turns.spans)]


def decode_responses(rollout: RolloutBatch, decode) -> list[str]:
    """The text a reward sees: the response, or for a multi-turn rollout its assistant turns only, joined by
    newlines (tool output and template tokens are not in it)."""
    if rollout.turns is not None:
        return ["\n".join(turns) for turns in assistant_turns(rollout, decode)]
    rows = rollout.tokens.tolist()
    starts, lengths = rollout.prompt_lengths.tolist(), rollout.response_lengths.tolist()
    return [decode(row[s:s + n]) for row, s, n in zip(rows, starts, lengths)]


def last_policy_token(mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B] column of each row's last loss-mask token (where its score goes), the row's last token without one.

    >>> last_policy_token(torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]), torch.tensor([4, 2])).tolist()
    [2, 1]
    """
    cols = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), cols, -1).max(dim=1).values
    return torch.where(last >= 0, last, (lengths - 1).clamp(min=0))


def make_batch(rollout: RolloutBatch, scores: torch.Tensor, group_index: torch.Tensor, seq_len: int) -> StepBatch:
    """RolloutBatch + sequence scores [B] -> the step batch (per-token fields padded to seq_len). Its
    response_mask is the rollout's loss mask (verl's multi-turn convention: response_mask = loss_mask), and
    the score sits at the last policy token (the last response token, single turn). R3: the rollout's experts
    (`routed_experts`) come along, replayed by every pass over the batch."""
    pad = seq_len - rollout.tokens.size(1)
    mask = F.pad(rollout.loss_mask, (0, pad)).float()
    lengths = rollout.total_lengths
    last = last_policy_token(mask, lengths)
    token_scores = torch.zeros_like(mask)
    rows = torch.arange(mask.size(0), device=mask.device)
    token_scores[rows, last] = scores.to(mask.dtype) * (rollout.response_lengths > 0)
    return StepBatch(
        tokens=F.pad(rollout.tokens, (0, pad)), lengths=lengths, response_mask=mask,
        rollout_logp=F.pad(rollout.rollout_logprobs.float(), (0, pad)), token_level_scores=token_scores,
        group_index=group_index, response_lengths=rollout.response_lengths, prompt_lengths=rollout.prompt_lengths,
        routed_experts=None if rollout.routed_experts is None else pad_columns(rollout.routed_experts, seq_len),
        pixel_values=rollout.pixel_values, image_grid_thw=rollout.image_grid_thw)


def score(run, rollout: RolloutBatch, prompts, baseline: torch.Tensor | None) -> tuple[StepBatch, dict, dict]:
    """The step batch with its scores: the reward functions' (+ the reward model's, when there is one) and
    the greedy baseline's rewards (None unless the estimator needs them); the step metrics; and the
    per-sample values that `algorithm.filter_groups.metric` may name (`schema.FILTER_METRICS`), each [B]."""
    scored, metrics = run.scorer.score_step(rollout, prompts, run.cfg.rollout.n)
    if rollout.turns is not None:  # multi-turn: num_turns/*, tool calls, tool error and time-out rates
        metrics.update(reduce_outputs([turn_report(rollout.turns)], run.ctx))
    batch = make_batch(rollout, scored.scores, run.group_index(len(prompts)), run.seq_len).replace(
        baseline_rewards=baseline)
    if run.roles.reward is not None:
        rm_scores = reward_model_pass(run.roles, batch, run.cfg, run.ctx)
        batch = batch.replace(token_level_scores=batch.token_level_scores + rm_scores)
    seq_reward = batch.token_level_scores.sum(-1).cpu()  # the KL penalty is not in it yet (verl: token_level_rewards)
    values = {"acc": scored.acc, "format": scored.formatted, "reward": scored.scores.cpu(), "score": scored.raw,
              "seq_reward": seq_reward, "seq_final_reward": seq_reward}
    return batch, metrics, values


def seq_multiple(cfg) -> int:
    """Micro-batch sequence lengths are padded to this: sequence parallelism splits them over TP."""
    return cfg.parallel.tp if cfg.parallel.sequence_parallel else 1


def micro_batching(cfg, section, forward_only: bool = False) -> dict:
    """split_micro_batches arguments for a role's section (actor or critic; forward passes use the actor's):
    token-budget micro-batches under the section's max_tokens_per_gpu (its use_dynamic_bsz), packed ones
    (`data.use_sequence_packing`) under actor.max_tokens_per_gpu, or fixed-size ones. A budget of 0 is
    automatic: the section's micro_batch_size_per_gpu rows of the batch's longest row (`packing.token_budget`),
    so packed micro-batches hold no more tokens than the largest padded one. `forward_only` passes (no
    activations kept for a backward) take actor.log_prob_max_tokens_per_gpu instead when it is set."""
    pack = cfg.data.use_sequence_packing
    budget = section.max_tokens_per_gpu if section.use_dynamic_bsz else cfg.actor.max_tokens_per_gpu if pack else 0
    if forward_only and (section.use_dynamic_bsz or pack) and cfg.actor.log_prob_max_tokens_per_gpu > 0:
        budget = cfg.actor.log_prob_max_tokens_per_gpu
    return dict(micro_batch_size=section.micro_batch_size_per_gpu, max_tokens=budget, multiple=seq_multiple(cfg),
                pack=pack, dynamic=section.use_dynamic_bsz)


def needs_sum_pi_squared(cfg) -> bool:
    """The estimator declared it needs the old policy's sum_v pi(v)^2 (optimal token baseline)."""
    return estimator_needs(cfg.algorithm.adv_estimator).sum_pi_squared


def actor_loss_fn(cfg, ctx, model, forward_only: bool = False, loss: Callable = actor_loss):
    """The actor's loss function bound to its config (forward-only: also sum pi^2 when the estimator needs it)."""
    num_rows = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
    return partial(loss, model=model, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor,
                   temperature=cfg.rollout.temperature, norm_length=float(cfg.rollout.max_response_length),
                   num_rows=num_rows,
                   with_sum_pi_squared=forward_only and needs_sum_pi_squared(cfg))


def critic_loss_fn(cfg) -> Callable:
    """The critic's loss function: value clipping, and critic.loss_agg_mode ("" = the actor's, as verl)."""
    return partial(critic_loss, cliprange_value=cfg.critic.cliprange_value, loss_agg_mode=critic_agg_mode(cfg),
                   norm_length=float(cfg.rollout.max_response_length),
                   num_rows=cfg.critic.ppo_mini_batch_size * cfg.rollout.n)


@dataclass(frozen=True, slots=True)
class LossFns:
    """The roles' loss functions, bound to the config once at start-up (megatron's loss_fn contract)."""

    actor: Callable  # the actor update: (loss_sum, count, metrics)
    actor_first: Callable | None  # its first mini-batch when pi_old is the rollout's: + the rollout mismatch
    old_logp: Callable  # forward-only actor: log-probs (+ sum pi^2 when the estimator needs it)
    ref: Callable | None  # forward-only reference: log-probs (None without a reference)
    critic: Callable | None  # the critic update and its forward-only values (None without a critic)


def build_loss_fns(cfg, ctx, roles, update_loss: Callable = actor_loss) -> LossFns:
    """`update_loss`: the actor's loss function for its update (`losses.actor_loss`)."""
    critic = critic_loss_fn(cfg) if roles.critic is not None else None
    actor = actor_loss_fn(cfg, ctx, roles.actor.module, loss=update_loss)
    return LossFns(actor=actor, actor_first=partial(actor, measure_mismatch=True) if old_from_rollout(cfg) else None,
                   old_logp=actor_loss_fn(cfg, ctx, roles.actor.module, forward_only=True),
                   ref=actor_loss_fn(cfg, ctx, roles.ref) if roles.ref is not None else None, critic=critic)


def is_on_policy(cfg, rows: int, rows_per_mini: int) -> bool:
    """One epoch over one mini-batch holding all `rows` samples, no KL in the reward, and an estimator that
    needs nothing from the old policy: the update's first forward sees exactly the weights that the
    old-log-prob pass would, so that pass is skipped and the update takes pi_old from its own forward
    (detached; `losses.actor_loss`)."""
    return (cfg.actor.ppo_epochs == 1 and rows_per_mini >= rows and not cfg.algorithm.use_kl_in_reward
            and not needs_sum_pi_squared(cfg))


def old_from_rollout(cfg) -> bool:
    """pi_old is the rollout engine's log-probs, no old-policy pass: actor.old_log_prob=rollout, or the
    bypass_mode loss (which reads the rollout's log-probs itself, as verl's bypass mode) unless the pass is
    needed for more than log-probs (sum pi^2 for OTB, R2's recorded experts; R3's come from the rollout)."""
    needs_pass = needs_sum_pi_squared(cfg) or cfg.actor.router_replay == "R2"
    return cfg.actor.old_log_prob == "rollout" or (cfg.actor.policy_loss == "bypass_mode" and not needs_pass)


def forward_passes(roles, losses: LossFns, batch: StepBatch, cfg, ctx, timings: dict,
                   on_policy: bool = False) -> StepBatch:
    """Forward-only passes, each timed: old log-probs (actor, timing_s/old_log_prob, unless on_policy or
    `old_from_rollout`; + sum pi^2 for OTB), reference log-probs (timing_s/ref), values (critic, timing_s/values)."""
    seq = batch.tokens.size(1)
    from_rollout = old_from_rollout(cfg) and not on_policy
    if from_rollout:
        batch = batch.replace(old_logp=batch.rollout_logp)
    if roles.ref is None and roles.critic is None and (on_policy or from_rollout):
        timings["old_log_prob"] = 0.0
        return batch
    mbs = split_micro_batches(batch, **micro_batching(cfg, cfg.actor, forward_only=True))
    with heartbeat(f"log-prob passes ({len(mbs)} micro-batches)", enabled=ctx.is_logging_rank):
        return batch.replace(**_forward_passes(roles, losses, mbs, seq, cfg, ctx, timings,
                                               skip_old=on_policy or from_rollout))


def _forward_passes(roles, losses: LossFns, mbs: list, seq: int, cfg, ctx, timings: dict, skip_old: bool) -> dict:
    out = {}
    with timer("old_log_prob", timings):
        if not skip_old:
            keys = ("logp", "sum_pi_squared") if needs_sum_pi_squared(cfg) else ("logp",)
            routing = old_pass_routing(cfg, roles.actor.model, mbs, seq)
            with routing or nullcontext():
                res = forward_collect(roles.actor.model, mbs, losses.old_logp, keys, seq, ctx.pgs.pp, hooks=routing)
            out["old_logp"] = res["logp"]
            if routing is not None and routing.recorded is not None:  # R2
                out["routed_experts"] = routing.recorded
            if "sum_pi_squared" in res:
                out["sum_pi_squared"] = res["sum_pi_squared"]
    if roles.ref is not None:
        with timer("ref", timings):
            routing = RoutingHooks.for_model([roles.ref], replay=True) if cfg.actor.router_replay == "R3" else None
            with routing or nullcontext():
                out["ref_logp"] = forward_collect([roles.ref], mbs, losses.ref, ("logp",), seq, ctx.pgs.pp,
                                                  hooks=routing)["logp"]
    if roles.critic is not None:
        with timer("values", timings):
            out["values"] = forward_collect(roles.critic.model, mbs, losses.critic, ("values",), seq,
                                            ctx.pgs.pp)["values"]
    return out


def old_pass_routing(cfg, chunks: list, mbs: list, seq: int) -> RoutingHooks | None:
    """The old-log-prob pass's routing hooks on an MoE actor: actor.router_replay=R2 records the old policy's
    experts per (row, position) (`routed_experts`, replayed by the update whatever its micro-batches); R3
    replays the rollout's (already in the batch); else None."""
    if cfg.actor.router_replay == "R3":
        return RoutingHooks.for_model(chunks, replay=True)
    if cfg.actor.router_replay != "R2":
        return None
    rows = sum(mb["row_index"].numel() for mb in mbs)
    return RoutingHooks.for_model(chunks, record_shape=(rows, seq))


def reward_model_pass(roles, batch: dict, cfg, ctx) -> torch.Tensor:
    """[B, S] reward-model scores at each sequence's last token."""
    mbs = split_micro_batches(batch, **micro_batching(cfg, cfg.actor, forward_only=True))
    return forward_collect([roles.reward], mbs, reward_model_scores, ("scores",), batch["tokens"].size(1),
                           ctx.pgs.pp)["scores"]


def gather_dp(t: torch.Tensor, ctx) -> torch.Tensor:
    """Concatenate a per-sample tensor over the DP group (rank order)."""
    if ctx.dims.dp == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(ctx.dims.dp)]
    dist.all_gather(parts, t.contiguous(), group=ctx.pgs.dp)
    return torch.cat(parts)


def balance_dp(batch: StepBatch, cfg, ctx, rows_per_mini: list[int]) -> StepBatch:
    """With packing, give the DP ranks balanced token counts (micro-batches follow tokens, so the rank with
    the most would make the others wait). Within every chunk of gcd(rows_per_mini) rows, which keeps each
    global mini-batch's rows, the ranks' rows are pooled and dealt out again: equal counts, balanced tokens."""
    if not cfg.data.use_sequence_packing or ctx.dims.dp == 1:
        return batch
    num, dp, chunk = batch.num_rows, ctx.dims.dp, math.gcd(*rows_per_mini)
    fields = {**{k: v for k, v in batch.items() if k not in ROW_FIELDS}, **uniform_row_fields([batch], ctx)[0]}
    full = {k: gather_dp(v, ctx) for k, v in fields.items()}
    lengths = full["lengths"].tolist()
    mine = []
    for start in range(0, num, chunk):
        pool = [r * num + i for r in range(dp) for i in range(start, min(start + chunk, num))]
        parts = plan_dp_split([lengths[i] for i in pool], dp)
        mine += [pool[i] for i in parts[ctx.dp_rank]]
    return batch.replace(**take(full, torch.tensor(mine, device=batch.tokens.device)))


def mean_over_dp(mean: torch.Tensor, num_rows: int, ctx) -> torch.Tensor:
    """The global-batch mean of a per-rank mean over `num_rows` rows (no host sync)."""
    if ctx.dims.dp == 1:
        return mean
    total = torch.stack([mean.float() * num_rows, torch.tensor(float(num_rows), device=mean.device)])
    dist.all_reduce(total, group=ctx.pgs.dp)
    return total[0] / total[1]


def compute_advantages(batch: StepBatch, cfg, kl_coef: float, ctx) -> tuple[StepBatch, dict, torch.Tensor | None]:
    """Token rewards (with the KL penalty when it goes in the reward) and advantages, computed on the
    whole global batch (gathered over DP) so whitening and group statistics never depend on the layout.
    Returns (batch, metrics, reward KL): the KL controller's input, None when KL is not in the reward."""
    metrics, reward_kl = {}, None
    rewards = batch.token_level_scores
    if cfg.algorithm.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(rewards, batch.old_logp, batch.ref_logp, batch.response_mask,
                                               kl_coef, cfg.algorithm.kl_penalty)
        metrics.update({f"actor/reward_{k}": v for k, v in kl_metrics.items()})
        reward_kl = mean_over_dp(kl_metrics["kl"], batch.num_rows, ctx)  # every rank's controller sees one value
        metrics["actor/reward_kl"] = reward_kl  # the global-batch mean, not this DP rank's
    full = {k: gather_dp(v, ctx) for k, v in (("rewards", rewards), ("mask", batch.response_mask),
                                              ("group", batch.group_index))}
    wanted = ("values", "baseline_rewards") + (("old_logp", "sum_pi_squared", "is_weights")
                                               if "sum_pi_squared" in batch else ())  # the OTB inputs
    optional = {key: gather_dp(batch[key], ctx) for key in wanted if key in batch}
    a = cfg.algorithm
    adv, returns = ADVANTAGES.get(a.adv_estimator)(AdvantageInputs(
        token_level_rewards=full["rewards"], response_mask=full["mask"], group_index=full["group"], **optional,
        gamma=a.gamma, lam=a.lam, norm_adv_by_std=a.norm_adv_by_std,
        returns_through_masked=a.returns_through_masked, gpg_paper_alpha=a.gpg_paper_alpha))
    b = batch.num_rows
    mine = slice(ctx.dp_rank * b, (ctx.dp_rank + 1) * b)
    return batch.replace(token_level_rewards=rewards, advantages=adv[mine], returns=returns[mine]), metrics, reward_kl


def rollout_correction(batch: StepBatch, cfg) -> tuple[StepBatch, dict]:
    """Importance weights between the rollout engine's log-probs and the trainer's (mismatch metrics too).
    On-policy steps have no old_logp yet, and with `old_from_rollout` it is the rollout's: the actor loss
    measures the mismatch in its first mini-batch instead (at the rollout's weights). With partial rollouts
    (`async_training.partial_rollout`) old_logp is recomputed at the current weights and the behaviour
    log-probs may be a version or more behind: actor.rollout_correction=none then means token-level truncated
    weights (decoupled PPO), any other setting is taken as given."""
    actor_cfg = cfg.actor
    if batch.old_logp is None or old_from_rollout(cfg):
        return batch, {}
    if cfg.async_training.partial_rollout and actor_cfg.rollout_correction == "none":  # stale tokens: decoupled PPO
        actor_cfg = replace(actor_cfg, rollout_correction="token")
    weights, metrics = rollout_mismatch(batch.old_logp, batch.rollout_logp, batch.response_mask, actor_cfg)
    return batch.replace(is_weights=weights), metrics


def update_role(name: str, state, batch: dict, loss_fn, section, rows_per_mini: int, lr: float,
                batching: dict, first_loss_fn: Callable | None = None) -> list[dict]:
    """ppo_epochs x mini-batches of forward-backward over micro-batches (`batching`: micro_batching(...)),
    one optimizer step each; `first_loss_fn` (if given) replaces loss_fn for the first mini-batch, the one
    that runs at the weights the rollout used. Returns the loss functions' reports plus one
    {"<name>/grad_norm"} per step."""
    rows = batch["tokens"].size(0)
    reports = []
    num_steps = section.ppo_epochs * -(-rows // rows_per_mini)
    routing = RoutingHooks.for_model(state.model, replay="routed_experts" in batch)  # MoE actor: replay, counts
    with progress(num_steps, f"update_{name}", dist.get_rank() == 0, unit="optimizer steps") as bar, \
            moe_update_metrics(routing, reports):
        for epoch in range(section.ppo_epochs):
            for start in range(0, rows, rows_per_mini):
                mbs = split_micro_batches(take(batch, slice(start, start + rows_per_mini)), **batching)
                zero_grads(state)
                fn = first_loss_fn if first_loss_fn is not None and epoch == start == 0 else loss_fn
                reports += run_schedule(state.model, mbs, fn, forward_only=False, hooks=routing)
                applied, grad_norm = optimizer_step(state, lr)  # skipped (weights kept) when not finite
                reports.append({f"{name}/grad_norm": torch.tensor(grad_norm),
                                f"{name}/skipped_update_frac": torch.tensor(0.0 if applied else 1.0)})
                bar.update(1)
    return reports
