"""Partial rollouts (rollout/partial.py, trainer/partial_rollout.py) against a scripted engine whose samples have
known lengths: a step trains the groups that finish first and never decodes past them; a carried sample keeps its
tokens, behaviour log-probs and versions and continues from its exact prefix; the staleness bound resets what
would lag too far (counted); the trained batch has the engine contract's layout; a checkpoint drops what is in
flight; the metrics match a hand count."""
import dataclasses
import types

import pytest
import torch

from rlhf_mcore.rollout.partial import PartialPool, StopRule, auto_round_tokens, staleness_metrics, to_rollout_batch
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.trainer.partial_rollout import PartialRollouts

STOP, PAD = 0, 99


@dataclasses.dataclass(frozen=True)
class Row:
    prompt_ids: tuple


class ScriptedEngine:
    """Sample j of prompt p answers LENGTHS[p][j] tokens (the last is STOP). Token t of a response is 100 + t,
    with log-prob -(t + 1) / 100 - version / 1000 (the version: how many update_weights calls so far)."""

    def __init__(self, lengths: dict, prompt_len: int = 2):
        self.lengths, self.prompt_len, self.version, self.calls = lengths, prompt_len, 0, []
        self.next_sample: dict = {}
        self.engine = self  # the rollout layer's engine: partial rollouts call it directly

    def generate(self, rows, params: SamplingParams, show_progress=False) -> RolloutBatch:
        rows = [Row(tuple(getattr(r, "prompt_ids", r))) for r in rows]
        self.calls.append([len(r.prompt_ids) for r in rows])
        out_tokens, out_lp, reasons = [], [], []
        for row in rows:
            ids = list(row.prompt_ids)
            prompt, done = ids[: self.prompt_len], ids[self.prompt_len:]
            if done:  # a continuation: its length is in its first token
                total = done[0] - 1000
            else:  # a fresh sample: the next of its prompt's scripted lengths
                j = self.next_sample.get(prompt[0], 0)
                self.next_sample[prompt[0]] = j + 1
                total = self.lengths[prompt[0]][j % len(self.lengths[prompt[0]])]
            new = [STOP if t == total - 1 else 1000 + total if t == 0 else 100 + t
                   for t in range(len(done), min(total, len(done) + params.max_new_tokens))]
            out_tokens.append(ids + new)
            out_lp.append([0.0] * len(ids) + [-(len(done) + k + 1) / 100 - self.version / 1000
                                              for k in range(len(new))])
            reasons.append("stop" if new and new[-1] == STOP else "length")
        width = max(map(len, out_tokens))
        tokens = torch.tensor([t + [PAD] * (width - len(t)) for t in out_tokens])
        lp = torch.tensor([x + [0.0] * (width - len(x)) for x in out_lp])
        lengths = [len(t) - len(r.prompt_ids) for t, r in zip(out_tokens, rows)]
        return RolloutBatch(tokens=tokens, prompt_lengths=torch.tensor([len(r.prompt_ids) for r in rows]),
                            response_lengths=torch.tensor(lengths), rollout_logprobs=lp, finish_reasons=reasons)


def cfg(n=2, max_len=16, round_tokens=4, lag=1):
    return types.SimpleNamespace(
        rollout=types.SimpleNamespace(n=n, max_response_length=max_len),
        async_training=types.SimpleNamespace(partial_rollout=True, staleness_threshold=lag, round_tokens=round_tokens,
                                             continuous=True, max_num_seqs=0))


class Sampler:
    def __init__(self, per_batch: int):
        self.next_id, self.per_batch = 1, per_batch

    def next_batch(self):
        rows = [Row((self.next_id + i, 7)) for i in range(self.per_batch)]
        self.next_id += self.per_batch
        return rows


PARAMS = SamplingParams(n=2, max_new_tokens=16, stop_token_ids=(STOP,), seed=5)


def run_steps(lengths, steps, engine_cls=None, **kw):
    engine = (engine_cls or ScriptedEngine)(lengths)
    sampler, partial = Sampler(2), PartialRollouts(cfg(**kw), PAD, engine=engine)
    out = []
    for step in range(steps):
        engine.version = step
        out.append(partial.generate(engine, sampler.next_batch, PARAMS, step))
    return engine, partial, out


def test_a_step_trains_the_first_groups_to_finish_and_carries_the_rest():
    # prompts 1, 2 (batch 1) and 3, 4 (batch 2) are in flight at step 0; 2 and 4 have a 16-token sample
    lengths = {1: [3, 4], 2: [4, 16], 3: [2, 4], 4: [16, 3], 5: [4, 4], 6: [4, 4]}
    engine, partial, out = run_steps(lengths, 2)
    prompts, batch, report = out[0]
    assert [p.prompt_ids[0] for p in prompts] == [1, 3]  # the groups that finished in round 1
    assert engine.calls[0] == [2] * 8  # step 0: one round of 4 tokens over 2 batches of 2 x 2 samples: enough groups
    assert batch.response_lengths.tolist() == [3, 4, 2, 4] and batch.finish_reasons == ["stop"] * 4
    assert report["async/samples_carried_total"][0] == 4.0 and report["async/staleness_mean"][0] == 0.0
    prompts, batch, report = out[1]  # step 1: prompt 2's and 4's long samples continue from 4 tokens
    assert engine.calls[1][:2] == [2 + 4, 2 + 4]  # continuations: prompt + the 4 tokens of step 0
    # they would lag 2 versions at step 2: step 1 decodes them to their end (3 more rounds) and trains them first
    assert len(engine.calls) == 4 and [p.prompt_ids[0] for p in prompts] == [2, 4]
    assert batch.response_lengths.tolist() == [4, 16, 16, 3] and report["async/rounds"][0] == 3.0


def test_a_long_sample_finishes_before_it_would_lag_too_far_and_keeps_each_tokens_version():
    lengths = {1: [16, 16], 2: [4, 4], 3: [4, 4], 4: [4, 4], 5: [4, 4], 6: [4, 4]}
    engine, partial, out = run_steps(lengths, 2, lag=1)
    assert [p.prompt_ids[0] for p in out[0][0]] == [2, 3]  # step 0: one round; prompt 1 has 4 of 16 tokens
    prompts, batch, report = out[1]
    # step 1: prompt 1 would lag 2 versions at step 2, so step 1 decodes it to its end and trains it first
    assert [p.prompt_ids[0] for p in prompts] == [1, 4] and len(engine.calls) == 1 + 3
    lp, v = batch.rollout_logprobs[0, 2:18], batch.response_lengths[0]
    assert v == 16 and batch.tokens[0, 2 + 15] == STOP
    expected = [-(t + 1) / 100 - (0 if t < 4 else 1) / 1000 for t in range(16)]  # tokens 0-3 sampled at version 0
    assert torch.allclose(lp, torch.tensor(expected))
    # lag one version: prompt 1's first 4 tokens of each sample, and all of prompt 4's (it finished at step 0 and
    # waited): 8 + 8 of 40 tokens
    lag_tokens = 2 * 4 + 2 * 4
    total = int(batch.loss_mask.sum())
    assert report["async/staleness_max"][0] == 1.0
    assert report["async/off_policy_token_frac"][0] == pytest.approx(lag_tokens / total)
    assert report["async/staleness_mean"][0] == pytest.approx(lag_tokens / total)


class ContinuousEngine(ScriptedEngine):
    """The scripted samples through `num_slots` slots, one token per slot per tick: a slot whose row ends takes the
    next queued row in the same tick (continuous batching); the call stops when on_finish says so and returns
    the rows still running, cut. `ticks` counts decode steps, `rows_started` the rows given a slot per call."""

    continuous = True

    def __init__(self, lengths: dict):
        super().__init__(lengths)
        self.ticks, self.rows_started = 0, []

    def generate_continuous(self, rows, limits, params, on_finish, num_slots, feed=None):
        from rlhf_mcore.rollout.responses import Response

        queue, running, started = list(range(len(rows))), {}, 0
        while queue or running:
            while queue and len(running) < num_slots:
                i = queue.pop(0)
                running[i], started = [], started + 1
            self.ticks += 1
            stop = False
            for i in list(running):
                ids = list(rows[i]) + running[i]
                one = self.generate([Row(tuple(ids))], dataclasses.replace(params, max_new_tokens=1))
                token = int(one.tokens[0, len(ids)])
                running[i].append(token)
                if token == STOP or len(running[i]) >= limits[i]:
                    new = running.pop(i)
                    logprobs = self._logprobs(rows[i], len(new))
                    stop |= on_finish(i, Response(new, logprobs, "stop" if token == STOP else "length"))
            if stop:
                break
        self.rows_started.append(started)
        return {i: Response(t, self._logprobs(rows[i], len(t)), "abort") for i, t in running.items()}

    def _logprobs(self, row, n):
        done = len(row) - self.prompt_len
        return [-(done + k + 1) / 100 - self.version / 1000 for k in range(n)]


def full_response(total: int) -> list[int]:
    return [STOP if t == total - 1 else 1000 + total if t == 0 else 100 + t for t in range(total)]


def test_continuous_steps_train_whole_groups_whose_tokens_continue_exactly():
    """Long-tailed lengths through the continuous path: every trained sample is its full scripted response (cut
    samples continued from their exact prefix, across steps), each token's version is the step that decoded it
    and lags at most 1."""
    lengths = {k: [3, 14] if k % 3 == 0 else [2, 5] if k % 3 == 1 else [4, 4] for k in range(1, 40)}
    steps = 6
    engine, partial, out = run_steps(lengths, steps, engine_cls=ContinuousEngine)
    assert partial.continuous
    for step, (prompts, batch, report) in enumerate(out):
        assert len(prompts) == 2 and report["async/staleness_max"][0] <= 1
        for i in range(batch.tokens.size(0)):
            start, n = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
            assert batch.tokens[i, start:start + n].tolist() == full_response(n)
            assert batch.finish_reasons[i] == "stop"
    assert any(r["async/samples_carried_total"][0] for _, _, r in out)
    assert any(r["async/staleness_mean"][0] > 0 for _, _, r in out), "some trained tokens were decoded a step early"
    assert all(started <= 2 * 2 * 2 for started in engine.rows_started)  # never more than the samples in flight


def test_continuous_stops_once_the_step_has_its_groups_and_no_urgent_group_is_left():
    """Step 0 trains prompts 2 and 3 (short) and cuts prompt 1's long samples; step 1 must finish prompt 1 (it
    would lag 2 versions at step 2) even though two other groups completed first, and trains it first."""
    lengths = {1: [12, 12], 2: [2, 2], 3: [2, 3], 4: [2, 2], 5: [2, 2], 6: [2, 2]}
    engine, partial, out = run_steps(lengths, 2, engine_cls=ContinuousEngine)
    assert [p.prompt_ids[0] for p in out[0][0]] == [2, 3]
    prompts, batch, report = out[1]
    assert [p.prompt_ids[0] for p in prompts] == [1, 4]
    assert batch.response_lengths.tolist()[:2] == [12, 12]
    # 4 slots, oldest first: 1a 1b 2a 2b; group 2 ends at tick 2, 3a 3b take its slots, group 3 ends at tick 5
    # (4a took 3a's slot at tick 5): carried are prompt 1 (5 tokens each) and prompt 4 (4a: 1 token)
    assert out[0][2]["async/samples_carried_total"][0] == 4
    lp = batch.rollout_logprobs[0, 2:14]
    first = next(k for k in range(12) if abs(lp[k] + (k + 1) / 100 + 1 / 1000) < 1e-6)  # the first token of step 1
    assert first == 5 and torch.allclose(lp[:first], torch.tensor([-(k + 1) / 100 for k in range(first)]))
    assert report["async/staleness_max"][0] == 1.0


def test_the_stop_rule_counts_a_group_once_when_its_samples_end_together():
    """Multi-turn: both samples of a group come back from their tools in one poll and end at their budget; each is
    reported after both are marked ended. The group counts once, so the step still needs a second one."""
    pool = PartialPool(n=2, max_response_length=8, lag=1)
    pool.admit([Row((1, 7)), Row((2, 7))], step=0)
    rule = StopRule(pool, need=2, version=0)
    first, second = pool.groups[0].samples
    first.finish_reason = second.finish_reason = "length"
    assert not rule.finished(first) and not rule.finished(second) and not rule.satisfied()
    for sample in pool.groups[1].samples:
        sample.finish_reason = "stop"
    assert rule.finished(pool.groups[1].samples[1]) and pool.num_complete() == 2


def test_a_sample_that_would_lag_too_far_is_regenerated_and_counted():
    pool = PartialPool(n=1, max_response_length=8, lag=1)
    pool.admit([Row((1, 7))], step=0)
    sample = pool.groups[0].samples[0]
    sample.tokens, sample.logprobs, sample.versions = [5, 6], [-0.1, -0.2], [0, 0]
    assert pool.drop_stale(1) == 0 and sample.tokens == [5, 6]  # lag 1: allowed
    assert pool.drop_stale(2) == 1 and sample.tokens == [] and not sample.done  # lag 2: back to its prompt


def test_the_batch_has_the_engine_contract_layout():
    pool = PartialPool(n=2, max_response_length=8, lag=1)
    pool.admit([Row((1, 7)), Row((2, 7, 8))], step=3)
    for i, s in enumerate(s for g in pool.groups for s in g.samples):
        s.tokens, s.logprobs, s.versions, s.finish_reason = [10 + i] * (i + 1), [-0.5] * (i + 1), [3] * (i + 1), "stop"
    batch, versions = to_rollout_batch(pool.take_complete(2), PAD)
    assert batch.tokens.tolist()[3] == [2, 7, 8, 13, 13, 13, 13] and batch.prompt_lengths.tolist() == [2, 2, 3, 3]
    assert batch.tokens.tolist()[0] == [1, 7, 10, PAD, PAD, PAD, PAD]
    assert versions[0].tolist() == [-1, -1, 3, -1, -1, -1, -1] and pool.groups == []
    assert staleness_metrics(versions, batch.loss_mask, 4)["async/staleness_mean"] == 1.0


def test_a_checkpoint_drops_what_is_in_flight_and_the_next_step_counts_it():
    lengths = {k: [4, 16] for k in range(1, 20)}
    engine, partial, out = run_steps(lengths, 1)
    carried = partial.pool.carried()
    assert carried > 0
    partial.on_save()
    assert partial.pool.carried() == 0
    _, _, report = partial.generate(engine, Sampler(2).next_batch, PARAMS, 1)
    assert report["async/samples_dropped_at_save_total"][0] == carried


@pytest.mark.parametrize("length,expected", [(256, 64), (1024, 256), (12, 3)])
def test_auto_round_tokens_divides_the_budget(length, expected):
    assert auto_round_tokens(length) == expected and length % expected == 0
