"""Score a rollout: decode responses, call the reward functions (chosen per data_source, or
reward.custom_fn), add the optional overlong penalty. One rank per model-parallel group scores and
broadcasts, so reward functions run once per sample, not once per TP/PP rank."""
from __future__ import annotations

import torch
import torch.distributed as dist

from rlhf_mcore.phases import decode_responses
from rlhf_mcore.rewards import score_batch
from rlhf_mcore.rewards.penalties import format_penalties, overlong_penalties


class Scorer:
    def __init__(self, cfg, tokenizer, ctx):
        self.cfg, self.tokenizer, self.ctx = cfg, tokenizer, ctx

    def _score_here(self, rollout, prompts, n: int) -> torch.Tensor:
        r = self.cfg.reward
        rows = [p for p in prompts for _ in range(n)]
        responses = decode_responses(rollout, self.tokenizer.decode)
        result = score_batch([p.data_source for p in rows], responses,
                             [p.ground_truth for p in rows], [p.extra_info for p in rows],
                             custom_fn=r.custom_fn or None, timeout_s=r.timeout_s, num_workers=r.num_workers)
        scores = torch.tensor(result.scores, dtype=torch.float32)
        acc = result.extra.get("acc")
        acc = torch.tensor([float(a) if a is not None else float(s > 0) for a, s in zip(acc, result.scores)]) \
            if acc else (scores > 0).float()
        if r.overlong_buffer > 0:
            scores = scores + torch.tensor(overlong_penalties(
                rollout.response_lengths.cpu().tolist(), max_length=self.cfg.rollout.max_response_length,
                buffer=r.overlong_buffer, factor=r.overlong_penalty_factor))
        if r.format_penalty > 0:
            scores = scores + torch.tensor(format_penalties(responses, r.answer_format, r.format_penalty))
        counts = torch.tensor([float(result.num_errors), float(result.num_timeouts)])
        return torch.cat([scores, acc, counts])

    def __call__(self, rollout, prompts, n: int) -> tuple[torch.Tensor, dict]:
        num = rollout.tokens.size(0)
        mp = self.ctx.pgs.mp
        if mp.rank() == 0:
            packed = self._score_here(rollout, prompts, n)
        else:
            packed = torch.empty(2 * num + 2)
        if mp.size() > 1:
            dist.broadcast(packed, src=dist.get_process_group_ranks(mp)[0], group=mp)
        scores, acc, counts = packed[:num], packed[num:2 * num], packed[2 * num:]
        totals = counts.clone()
        acc_sum = acc.sum().reshape(1)
        if self.ctx.dims.dp > 1:
            dist.all_reduce(totals, group=self.ctx.pgs.dp)
            dist.all_reduce(acc_sum, group=self.ctx.pgs.dp)
        metrics = {"reward/errors": float(totals[0]), "reward/timeouts": float(totals[1]),
                   "critic/acc/mean": float(acc_sum) / (num * self.ctx.dims.dp)}
        return scores.to(self.ctx.device), metrics
