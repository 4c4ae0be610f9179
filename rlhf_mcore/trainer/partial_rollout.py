"""The step's rollout with `async_training.partial_rollout=true`: rounds of `round_tokens` through the rollout layer
until the step holds a batch of complete groups (`rlhf_mcore.rollout.partial` has the rules and the bookkeeping).
The pool is kept at `max_lag + 1` batches of groups in flight: a step trains one batch of them, the one that
finished first, and draws one batch of new prompts (all of them at the start and after a checkpoint), so data is
drawn at the synchronous pace. Collective like `generate`: every rank of a DP replica makes the same calls and the
same decisions, since they see the same prompts and the same engine results."""
from __future__ import annotations

import dataclasses
import logging

from rlhf_mcore.rollout.partial import PartialPool, auto_round_tokens, max_lag, staleness_metrics, to_rollout_batch
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams

log = logging.getLogger(__name__)
ROUND_SEED_STRIDE = 7919  # a round's seed: the step's seed + round * stride (distinct from dynamic sampling's)


class PartialRollouts:
    def __init__(self, cfg, pad_id: int, device=None):
        a, r = cfg.async_training, cfg.rollout
        self.round_tokens = a.round_tokens or auto_round_tokens(r.max_response_length)
        self.max_rounds = -(-r.max_response_length // self.round_tokens)  # every new sample ends within them
        self.pool = PartialPool(r.n, r.max_response_length, max_lag(a.staleness_threshold))
        self.pad_id, self.device = pad_id, device  # the trained batch goes where the engines put theirs
        self.dropped_at_save = 0

    def generate(self, rollout, draw, params: SamplingParams, step: int) -> tuple[list, RolloutBatch, dict]:
        """(the prompts of the groups this step trains, their batch, async metrics as (value, weight) reports).
        `step` is the policy version of the current weights; `draw()` gives the next batch of new prompts."""
        dropped = self.pool.drop_stale(step)
        prompts = draw()
        self.pool.admit(prompts, step)
        while len(self.pool.groups) < (self.pool.lag + 1) * len(prompts):  # the batches in flight
            self.pool.admit(draw(), step)
        rounds = 0
        while (self.pool.num_complete() < len(prompts) or self.pool.urgent(step)) and rounds < self.max_rounds + 1:
            active = self.pool.active()
            round_params = dataclasses.replace(params, n=1, max_new_tokens=self.round_tokens,
                                               seed=params.seed + (rounds + 1) * ROUND_SEED_STRIDE)
            rows = [dataclasses.replace(p, prompt_ids=tuple(p.prompt_ids) + tuple(s.tokens)) for p, s in active]
            self.pool.extend(active, rollout.generate(rows, round_params), step, params.stop_token_ids)
            rounds += 1
        groups = self.pool.take_complete(len(prompts))
        if len(groups) != len(prompts):  # cannot happen: max_rounds ends every sample
            raise RuntimeError(f"partial rollout: {len(groups)} complete groups after {rounds} rounds, "
                               f"{len(prompts)} needed")
        batch, versions = to_rollout_batch(groups, self.pad_id, self.device)
        tokens = float(batch.loss_mask.sum())
        report = {k: (v, tokens) for k, v in staleness_metrics(versions, batch.loss_mask, step).items()}
        report.update({"async/samples_carried_total": (float(self.pool.carried()), 1.0),
                       "async/samples_dropped_total": (float(dropped), 1.0),
                       "async/samples_dropped_at_save_total": (float(self.dropped_at_save), 1.0),
                       "async/rounds": (float(rounds), 1.0), "async/rounds_max": (float(rounds), 1.0)})
        self.dropped_at_save = 0
        return [g.prompt for g in groups], batch, report

    def on_save(self) -> None:
        """A checkpoint is written: drop what is in flight (resume stays bitwise; see rollout/partial.py)."""
        self.dropped_at_save += self.pool.clear()
