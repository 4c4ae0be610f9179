"""The step's rollout with `async_training.partial_rollout=true` (`rlhf_mcore.rollout.partial` has the rules and the
bookkeeping). The pool is kept at `max_lag + 1` batches of groups in flight: a step trains one batch of them, the one
that finished first, and draws one batch of new prompts (all of them at the start and after a checkpoint), so data is
drawn at the synchronous pace. Two ways to decode the pool:
- continuous (the native engine where its static decoder runs, `async_training.continuous=true`): one call of
  `engine.generate_continuous` over every unfinished sample, oldest first, through one step's worth of cache slots;
  a slot freed by a finished sample takes the next one at once, and the call stops as soon as the step has its
  batch of complete groups (`rlhf_mcore.rollout.continuous`);
- rounds (any engine, any layout): rounds of `round_tokens` through `engine.generate`, until the step has its batch.
  At EP > 1 the expert group agrees on each round, and a rank that has its batch joins with no rows.
Multi-turn (rollout.mode=multi_turn): a turn that calls tools leaves the decode until its results are back
(`rlhf_mcore.rollout.partial_turns`); then it continues in the same continuous call, or the next round.
A vision LM (rounds only: its engine decodes no continuous call): each round's rows go with their prompts' images
and lengths (an image id past the prompt is text), and the trained batch carries the images.
Collective like `generate`: every rank of a DP replica makes the same calls and the same decisions, since they see
the same prompts, the same engine results and the same tool results."""
from __future__ import annotations

import dataclasses
import logging

from rlhf_mcore.rollout.modes.multi_turn import agree_turn, sampled_turns
from rlhf_mcore.rollout.partial import (
    PartialPool,
    StopRule,
    auto_round_tokens,
    max_lag,
    staleness_metrics,
    to_rollout_batch,
)
from rlhf_mcore.rollout.partial_turns import ToolTurns
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.rollout.vision_decode import attach_images, row_images

log = logging.getLogger(__name__)
ROUND_SEED_STRIDE = 7919  # a round's seed: the step's seed + round * stride (distinct from dynamic sampling's)


class PartialRollouts:
    def __init__(self, cfg, pad_id: int, device=None, engine=None, env=None):
        """`env`: the multi-turn rollout's environment (`rollout.modes.ModeEnv`) with rollout.mode=multi_turn."""
        a, r = cfg.async_training, cfg.rollout
        self.round_tokens = a.round_tokens or auto_round_tokens(r.max_response_length)
        self.turns = ToolTurns(env, r.max_response_length) if env is not None else None
        self.stop_strings = tuple(env.stop_strings) if env is not None else ()  # the end of a tool call
        # every new sample ends within them (a turn's end may leave the rest of a round unused)
        self.max_rounds = -(-r.max_response_length // self.round_tokens) + (
            env.options.max_turns if env is not None else 0)
        self.pool = PartialPool(r.n, r.max_response_length, max_lag(a.staleness_threshold))
        self.pad_id, self.device = pad_id, device  # the trained batch goes where the engines put theirs
        self.continuous = a.continuous and bool(getattr(engine, "continuous", False))
        self.max_num_seqs = a.max_num_seqs  # slots of the continuous decode (0 = one step's samples)
        self.dropped_at_save = 0

    def describe(self) -> str:
        how = ("continuous batching (finished samples' slots are refilled mid-decode)" if self.continuous
               else f"rounds of {self.round_tokens} tokens")
        tools = "; a sample waiting on its tool calls leaves the decode to the others" if self.turns else ""
        return (f"rollout: partial rollouts (async_training): {how}, samples may lag {self.pool.lag} version(s); "
                f"unfinished samples carry over, and are dropped when a checkpoint is written{tools}")

    def generate(self, rollout, draw, params: SamplingParams, step: int) -> tuple[list, RolloutBatch, dict]:
        """(the prompts of the groups this step trains, their batch, async metrics as (value, weight) reports).
        `step` is the policy version of the current weights; `draw()` gives the next batch of new prompts."""
        dropped = self.pool.drop_stale(step)
        prompts = draw()
        self.pool.admit(prompts, step)
        while len(self.pool.groups) < (self.pool.lag + 1) * len(prompts):  # the batches in flight
            self.pool.admit(draw(), step)
        params = dataclasses.replace(params, n=1, stop_strings=tuple(params.stop_strings) + tuple(
            s for s in self.stop_strings if s not in params.stop_strings))
        decode = self._continuous if self.continuous else self._rounds
        rounds = decode(rollout, params, step, len(prompts))
        groups = self.pool.take_complete(len(prompts))
        if len(groups) != len(prompts):  # cannot happen: every sample ends within its budget
            raise RuntimeError(f"partial rollout: {len(groups)} complete groups after {rounds} rounds, "
                               f"{len(prompts)} needed")
        batch, versions = to_rollout_batch(groups, self.pad_id, self.device, multi_turn=self.turns is not None)
        prompts_of = [g.prompt for g in groups]
        images = prompt_images(rollout, prompts_of)
        batch = attach_images(batch, images, row_images(images, self.pool.n, len(groups)), self.device or "cpu")
        tokens = float(batch.loss_mask.sum())
        report = {k: (v, tokens) for k, v in staleness_metrics(versions, batch.loss_mask, step).items()}
        report.update({"async/samples_carried_total": (float(self.pool.carried()), 1.0),
                       "async/samples_dropped_total": (float(dropped), 1.0),
                       "async/samples_dropped_at_save_total": (float(self.dropped_at_save), 1.0),
                       "async/rounds": (float(rounds), 1.0), "async/rounds_max": (float(rounds), 1.0)})
        if self.turns is not None:
            report["async/samples_waiting_on_tools_total"] = (float(len(self.turns.pending)), 1.0)
        self.dropped_at_save = 0
        return prompts_of, batch, report

    def _ended(self, prompt, sample, tokens: list[int], logprobs: list[float], reason: str, step: int,
               stop_ids) -> None:
        """Append what a sample's row decoded. `reason`: "stop" (a stop token or string), "length" (its limit: the
        sample's budget, or a round's length), or "abort" (cut when the step's rollout stopped)."""
        limit = self.pool.max_response_length
        if self.turns is None:
            sample.add(tokens, logprobs, step, reason == "stop" or (bool(tokens) and tokens[-1] in stop_ids), limit)
            return
        sample.add(tokens, logprobs, step, False, limit)
        if reason == "stop" or sample.done:  # the turn ended (a turn that reached the budget ends the sample)
            self.turns.end_turn(sample, getattr(prompt, "extra_info", None), stop_ids)

    def _need_more(self, need: int, step: int) -> bool:
        return self.pool.num_complete() < need or self.pool.urgent(step)

    def _rounds(self, rollout, params: SamplingParams, step: int, need: int) -> int:
        """Rounds of round_tokens over every unfinished sample not waiting on a tool, until the step has its batch;
        the rounds that decoded this rank's rows. At EP > 1 the expert group's ranks agree on each round (one
        all-reduce), and a rank that has its batch joins it with no rows, so that the MoE all-to-alls meet."""
        engine = rollout.engine
        group, device = getattr(engine, "lockstep_group", None), self.device or "cpu"
        rounds = decoded = 0  # rounds run, and those this rank decoded rows in (not only joined at EP > 1)
        while rounds < self.max_rounds + 1:
            more = self._need_more(need, step)
            if self.turns is not None:  # what came back from the tools; wait for it when nothing else can decode
                idle = more and not any(not s.waiting for _, s in self.pool.active())
                self.turns.poll(block=idle)
                more = self._need_more(need, step)
            running, _ = agree_turn(group, device, int(more), self.round_tokens)
            if not running:
                break
            active = [(p, s) for p, s in self.pool.active() if not s.waiting] if more else []
            round_params = dataclasses.replace(params, max_new_tokens=self.round_tokens,
                                               seed=params.seed + (rounds + 1) * ROUND_SEED_STRIDE)
            images = prompt_images(rollout, [p for p, _ in active])  # a vision LM's rows continue with them
            pictures = {} if images is None else {"images": images,
                                                  "prompt_lengths": [len(p.prompt_ids) for p, _ in active]}
            batch = engine.generate([list(p.prompt_ids) + s.tokens for p, s in active], round_params, **pictures)
            # R3: this round re-routed each whole row (partial.Sample.routing), kept on the host while carried
            routed = None if batch.routed_experts is None else batch.routed_experts.cpu()
            for j, ((prompt, sample), (ids, logprobs, reason)) in enumerate(zip(active, sampled_turns(batch))):
                self._ended(prompt, sample, ids, logprobs, reason, step, params.stop_token_ids)
                if routed is not None:
                    sample.routing = routed[j, :len(prompt.prompt_ids) + len(sample.tokens)]
            rounds += 1
            decoded += bool(active)
        return decoded

    def _continuous(self, rollout, params: SamplingParams, step: int, need: int) -> int:
        """One continuous call over every unfinished sample (oldest first) through a step's worth of slots,
        stopped once the step has its batch; the samples cut then keep their tokens. Samples back from their
        tools join the call as they come. 1 (a call), or 0."""
        rule = StopRule(self.pool, need, step)
        if rule.satisfied():
            return 0
        rows = [(p, s) for p, s in self.pool.active() if not s.waiting]
        limit = self.pool.max_response_length
        stop_ids = params.stop_token_ids

        def on_finish(i: int, response) -> bool:
            prompt, sample = rows[i]
            self._ended(prompt, sample, response.tokens, response.logprobs, response.finish_reason, step, stop_ids)
            return rule.finished(sample) if sample.done else False

        feed = None if self.turns is None else ToolFeed(self.turns, rule, rows, self.pool, limit)
        cut = rollout.engine.generate_continuous(
            [list(p.prompt_ids) + s.tokens for p, s in rows], [limit - len(s.tokens) for _, s in rows],
            dataclasses.replace(params, seed=params.seed + ROUND_SEED_STRIDE), on_finish,
            num_slots=self.max_num_seqs or need * self.pool.n, feed=feed)
        for i, response in cut.items():
            self._ended(*rows[i], response.tokens, response.logprobs, "abort", step, stop_ids)
        return 1

    def on_save(self) -> None:
        """A checkpoint is written: drop what is in flight (resume stays bitwise; see rollout/partial.py)."""
        self.dropped_at_save += self.pool.clear()
        if self.turns is not None:
            self.turns.clear()


def prompt_images(rollout, prompts: list) -> list | None:
    """The rollout layer's images of `prompts` (`ModeEnv.prompt_images`); None for a text model."""
    env = getattr(rollout, "env", None)
    return None if env is None else env.prompt_images(prompts)


class ToolFeed:
    """The continuous call's feed (`rollout.continuous.Feed`): samples back from their tools join as new rows."""

    def __init__(self, turns: ToolTurns, rule: StopRule, rows: list, pool: PartialPool, limit: int):
        self.turns, self.rule, self.rows, self.limit = turns, rule, rows, limit
        self.prompt_of = {id(s): g.prompt for g in pool.groups for s in g.samples}
        self.bounds = (max((len(g.prompt.prompt_ids) for g in pool.groups), default=0) + limit, limit)

    def waiting(self) -> bool:
        return self.turns.waiting()

    def poll(self, block: bool) -> tuple[list[tuple[list[int], int]], bool]:
        new, stop = [], False
        for sample in self.turns.poll(block):
            if sample.done:  # its tool turn did not fit the budget
                stop |= self.rule.finished(sample)
                continue
            prompt = self.prompt_of[id(sample)]
            self.rows.append((prompt, sample))
            new.append((list(prompt.prompt_ids) + sample.tokens, self.limit - len(sample.tokens)))
        return new, stop
