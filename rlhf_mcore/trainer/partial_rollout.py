"""The step's rollout with `async_training.partial_rollout=true` (`rlhf_mcore.rollout.partial` has the rules and the
bookkeeping). The pool is kept at `max_lag + 1` batches of groups in flight: a step trains one batch of them, the one
that finished first, and draws one batch of new prompts (all of them at the start and after a checkpoint), so data is
drawn at the synchronous pace. Two ways to decode the pool:
- continuous (the native engine where its static decoder runs, `async_training.continuous=true`): one call of
  `engine.generate_continuous` over every unfinished sample, oldest first, through one step's worth of cache slots;
  a slot freed by a finished sample takes the next one at once, and the call stops as soon as the step has its
  batch of complete groups (`rlhf_mcore.rollout.continuous`);
- rounds (any engine): rounds of `round_tokens` through the rollout layer, until the step has its batch.
Collective like `generate`: every rank of a DP replica makes the same calls and the same decisions, since they see
the same prompts and the same engine results."""
from __future__ import annotations

import dataclasses
import logging

from rlhf_mcore.rollout.partial import (
    PartialPool,
    StopRule,
    auto_round_tokens,
    max_lag,
    staleness_metrics,
    to_rollout_batch,
)
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams

log = logging.getLogger(__name__)
ROUND_SEED_STRIDE = 7919  # a round's seed: the step's seed + round * stride (distinct from dynamic sampling's)


class PartialRollouts:
    def __init__(self, cfg, pad_id: int, device=None, engine=None):
        a, r = cfg.async_training, cfg.rollout
        self.round_tokens = a.round_tokens or auto_round_tokens(r.max_response_length)
        self.max_rounds = -(-r.max_response_length // self.round_tokens)  # every new sample ends within them
        self.pool = PartialPool(r.n, r.max_response_length, max_lag(a.staleness_threshold))
        self.pad_id, self.device = pad_id, device  # the trained batch goes where the engines put theirs
        self.continuous = a.continuous and bool(getattr(engine, "continuous", False))
        self.max_num_seqs = a.max_num_seqs  # slots of the continuous decode (0 = one step's samples)
        self.dropped_at_save = 0

    def describe(self) -> str:
        how = ("continuous batching (finished samples' slots are refilled mid-decode)" if self.continuous
               else f"rounds of {self.round_tokens} tokens")
        return (f"rollout: partial rollouts (async_training): {how}, samples may lag {self.pool.lag} version(s); "
                "unfinished samples carry over, and are dropped when a checkpoint is written")

    def generate(self, rollout, draw, params: SamplingParams, step: int) -> tuple[list, RolloutBatch, dict]:
        """(the prompts of the groups this step trains, their batch, async metrics as (value, weight) reports).
        `step` is the policy version of the current weights; `draw()` gives the next batch of new prompts."""
        dropped = self.pool.drop_stale(step)
        prompts = draw()
        self.pool.admit(prompts, step)
        while len(self.pool.groups) < (self.pool.lag + 1) * len(prompts):  # the batches in flight
            self.pool.admit(draw(), step)
        decode = self._continuous if self.continuous else self._rounds
        rounds = decode(rollout, params, step, len(prompts))
        groups = self.pool.take_complete(len(prompts))
        if len(groups) != len(prompts):  # cannot happen: every sample ends within its budget
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

    def _rounds(self, rollout, params: SamplingParams, step: int, need: int) -> int:
        """Rounds of round_tokens over every unfinished sample until the step has its batch; the rounds run."""
        rounds = 0
        while (self.pool.num_complete() < need or self.pool.urgent(step)) and rounds < self.max_rounds + 1:
            active = self.pool.active()
            round_params = dataclasses.replace(params, n=1, max_new_tokens=self.round_tokens,
                                               seed=params.seed + (rounds + 1) * ROUND_SEED_STRIDE)
            rows = [dataclasses.replace(p, prompt_ids=tuple(p.prompt_ids) + tuple(s.tokens)) for p, s in active]
            self.pool.extend(active, rollout.generate(rows, round_params), step, params.stop_token_ids)
            rounds += 1
        return rounds

    def _continuous(self, rollout, params: SamplingParams, step: int, need: int) -> int:
        """One continuous call over every unfinished sample (oldest first) through a step's worth of slots,
        stopped once the step has its batch; the samples cut then keep their tokens. 1 (a call), or 0."""
        rule = StopRule(self.pool, need, step)
        if rule.satisfied():
            return 0
        active = self.pool.active()
        limit = self.pool.max_response_length
        stop_ids = params.stop_token_ids

        def on_finish(i: int, response) -> bool:
            sample = active[i][1]
            stopped = response.finish_reason == "stop" or (bool(response.tokens) and response.tokens[-1] in stop_ids)
            sample.add(response.tokens, response.logprobs, step, stopped, limit)
            return rule.finished(sample) if sample.done else False

        cut = rollout.engine.generate_continuous(
            [list(p.prompt_ids) + s.tokens for p, s in active], [limit - len(s.tokens) for _, s in active],
            dataclasses.replace(params, n=1, seed=params.seed + ROUND_SEED_STRIDE), on_finish,
            num_slots=self.max_num_seqs or need * self.pool.n)
        for i, response in cut.items():
            active[i][1].add(response.tokens, response.logprobs, step, False, limit)
        return 1

    def on_save(self) -> None:
        """A checkpoint is written: drop what is in flight (resume stays bitwise; see rollout/partial.py)."""
        self.dropped_at_save += self.pool.clear()
