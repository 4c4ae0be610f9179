"""Score a rollout: decode responses, call the reward functions (chosen per data_source, or
reward.custom_fn), add the optional shaping (overlong, missing format, text after the answer). One rank per
model-parallel group scores and broadcasts, so reward functions run once per sample, not once per TP/PP rank.

Besides the shaped scores it keeps, per sample, accuracy and whether the answer was well formed, so that
training and validation log accuracy, format rate and score per data_source.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlhf_mcore.rewards.batch import score_batch
from rlhf_mcore.rewards.penalties import FORMAT_CHECKS, format_penalties, overlong_penalties, post_answer_penalties
from rlhf_mcore.trainer.phases import assistant_turns, decode_responses

log = logging.getLogger("rlhf_mcore")

COLUMNS = ("reward", "acc", "format")  # per-sample values reported per data_source


@dataclass(slots=True)
class Scored:
    scores: torch.Tensor  # [B] shaped reward (what the policy optimises), on the run's device
    acc: torch.Tensor  # [B] 1.0 when the answer is correct
    formatted: torch.Tensor  # [B] 1.0 when the response holds an answer in the expected format
    num_errors: float  # reward calls that failed on this DP rank
    num_timeouts: float
    raw: torch.Tensor | None = None  # [B] the reward functions' score, before shaping (verl's "score")
    provided: tuple[bool, bool] = (True, True)  # the reward gave "acc" / "pred" or "format" (else guessed)

    def columns(self) -> dict[str, list[float]]:
        return {"reward": self.scores.cpu().tolist(), "acc": self.acc.tolist(), "format": self.formatted.tolist()}


def accuracy_and_format(result, responses: list[str], answer_format: str) -> tuple[list[float], list[float]]:
    """Per sample: accuracy (the reward's "acc", else score > 0) and format (the reward's own "format", else its
    "pred" is not None, else the answer_format check on the text).

    >>> from rlhf_mcore.rewards.batch import RewardResult
    >>> accuracy_and_format(RewardResult([1.0, 0.1, 0.0], {"acc": [1.0, 0.0, 0.0], "pred": ["4", "5", None]},
    ...                                  0, 0), ["", "", ""], "gsm8k")
    ([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])
    >>> accuracy_and_format(RewardResult([1.5, 0.5], {"acc": [1.0, 0.0], "format": [1.0, 1.0]}, 0, 0), ["", ""],
    ...                     "gsm8k")
    ([1.0, 0.0], [1.0, 1.0])
    """
    acc, pred, own = result.extra.get("acc"), result.extra.get("pred"), result.extra.get("format")
    acc = [float(a) if a is not None else float(s > 0) for a, s in zip(acc, result.scores)] if acc \
        else [float(s > 0) for s in result.scores]
    check = FORMAT_CHECKS.get(answer_format)
    if own:
        fmt = [float(f) if f is not None else float(check(r)) for f, r in zip(own, responses)]
    else:
        fmt = [float(p is not None) for p in pred] if pred else [float(check(r)) for r in responses]
    return acc, fmt


def source_sums(sources, columns: dict[str, list[float]], keep=None) -> dict[str, dict[str, list[float]]]:
    """{data_source: {column: [sum, count]}} over the kept rows (validation pads with rows to drop).

    >>> source_sums(["a", "b", "a"], {"acc": [1.0, 0.0, 0.0]}, keep=[True, True, False])
    {'a': {'acc': [1.0, 1]}, 'b': {'acc': [0.0, 1]}}
    """
    sums: dict[str, dict[str, list[float]]] = {}
    for i, src in enumerate(sources):
        if keep is not None and not keep[i]:
            continue
        for name, values in columns.items():
            total = sums.setdefault(src, {}).setdefault(name, [0.0, 0])
            total[0] += values[i]
            total[1] += 1
    return sums


def merge_source_sums(parts: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Add the per-rank `source_sums` together."""
    merged: dict[str, dict[str, list[float]]] = {}
    for part in parts:
        for src, cols in part.items():
            for name, (total, count) in cols.items():
                into = merged.setdefault(src, {}).setdefault(name, [0.0, 0])
                into[0] += total
                into[1] += count
    return merged


def source_means(sums: dict, fmt: str) -> dict[str, float]:
    """Metric names from `fmt` (with {src} and {name}) -> means.

    >>> source_means({"openai/gsm8k": {"acc": [1.0, 4]}}, "val-core/{src}/{name}/mean@1")
    {'val-core/openai/gsm8k/acc/mean@1': 0.25}
    """
    return {fmt.format(src=src, name=name): total / max(count, 1)
            for src, cols in sorted(sums.items()) for name, (total, count) in cols.items()}


def gather_source_sums(sums: dict, ctx) -> dict:
    """Merged `source_sums` of every DP rank (one all_gather_object)."""
    if ctx.dims.dp == 1:
        return sums
    parts: list = [None] * ctx.dims.dp
    dist.all_gather_object(parts, sums, group=ctx.pgs.dp)
    return merge_source_sums(parts)


def reward_extra_info(rollout, rows, decode) -> list[dict]:
    """Each row's extra_info as the reward sees it; a multi-turn rollout adds its assistant turns' text
    (`assistant_turns`, tool output never in it) and its tool statistics (num_turns, tool_calls, tool_errors,
    tool_timeouts). tools_kwargs and interaction_kwargs (verl) stay in it as the data had them."""
    if rollout.turns is None:
        return [p.extra_info for p in rows]
    t = rollout.turns
    return [{**(p.extra_info or {}), "assistant_turns": turns, "num_turns": len(turns), "tool_calls": t.tool_calls[i],
             "tool_errors": t.tool_errors[i], "tool_timeouts": t.tool_timeouts[i]}
            for i, (p, turns) in enumerate(zip(rows, assistant_turns(rollout, decode)))]


def reward_budget_s(cfg) -> float:
    """The most one rank's reward batch may take: half the collective time-out, so a rank whose rewards hang
    reports reward time-outs (counted by the reward health guard) before the other ranks' collectives time out."""
    return 30.0 * cfg.parallel.collective_timeout_min


class Scorer:
    def __init__(self, cfg, tokenizer, ctx):
        self.cfg, self.tokenizer, self.ctx = cfg, tokenizer, ctx

    def _score_here(self, rollout, rows, responses: list[str]) -> torch.Tensor:
        r = self.cfg.reward
        result = score_batch([p.data_source for p in rows], responses,
                             [p.ground_truth for p in rows], reward_extra_info(rollout, rows, self.tokenizer.decode),
                             custom_fn=r.custom_fn or None, timeout_s=r.timeout_s, num_workers=r.num_workers,
                             format_score=r.format_score, budget_s=reward_budget_s(self.cfg))
        if result.num_timeouts:  # named here: the other ranks only see their collective wait
            log.warning("rank %d: %d of %d reward calls timed out (reward.timeout_s=%g; the whole batch may take "
                        "%.0f s)", dist.get_rank() if dist.is_initialized() else 0, result.num_timeouts,
                        len(responses), r.timeout_s, reward_budget_s(self.cfg))
        scores = raw = torch.tensor(result.scores, dtype=torch.float32)
        acc, fmt = accuracy_and_format(result, responses, r.answer_format)
        if r.overlong_buffer > 0:
            scores = scores + torch.tensor(overlong_penalties(
                rollout.response_lengths.cpu().tolist(), max_length=self.cfg.rollout.max_response_length,
                buffer=r.overlong_buffer, factor=r.overlong_penalty_factor))
        if r.format_penalty > 0:
            scores = scores + torch.tensor(format_penalties(responses, r.answer_format, r.format_penalty))
        if r.post_answer_penalty > 0:
            scores = scores + torch.tensor(post_answer_penalties(responses, r.answer_format, r.post_answer_penalty))
        counts = torch.tensor([float(result.num_errors), float(result.num_timeouts),
                               float("acc" in result.extra),
                               float("pred" in result.extra or "format" in result.extra)])
        return torch.cat([scores, torch.tensor(acc), torch.tensor(fmt), raw, counts])

    def score(self, rollout, prompts, n: int, responses: list[str] | None = None) -> Scored:
        """Scores of this DP rank's rows (prompt i's samples are rows i*n .. i*n+n-1), equal on its MP ranks."""
        num = rollout.tokens.size(0)
        mp = self.ctx.pgs.mp
        if mp.rank() == 0:
            rows = [p for p in prompts for _ in range(n)]
            responses = responses if responses is not None else decode_responses(rollout, self.tokenizer.decode)
            packed = self._score_here(rollout, rows, responses).to(self.ctx.device)
        else:
            packed = torch.empty(4 * num + 4, device=self.ctx.device)
        if mp.size() > 1:
            dist.broadcast(packed, src=dist.get_process_group_ranks(mp)[0], group=mp)
        host = packed.cpu()
        return Scored(packed[:num], host[num:2 * num], host[2 * num:3 * num], float(host[4 * num]),
                      float(host[4 * num + 1]), raw=host[3 * num:4 * num],
                      provided=(bool(host[4 * num + 2]), bool(host[4 * num + 3])))

    def __call__(self, rollout, prompts, n: int) -> tuple[torch.Tensor, dict]:
        """(shaped scores [B] on the device, step metrics: errors, accuracy, format rate, per data_source)."""
        scored, metrics = self.score_step(rollout, prompts, n)
        return scored.scores, metrics

    def score_step(self, rollout, prompts, n: int) -> tuple[Scored, dict]:
        """(this rank's per-sample `Scored`, step metrics reduced over DP) of a training rollout."""
        scored = self.score(rollout, prompts, n)
        sources = [p.data_source for p in prompts for _ in range(n)]
        sums = gather_source_sums(source_sums(sources, scored.columns()), self.ctx)
        lengths = rollout.response_lengths
        cut = (lengths >= self.cfg.rollout.max_response_length).sum().float().cpu()
        counts = torch.tensor([scored.num_errors, scored.num_timeouts, float(cut), float(lengths.numel()),
                               *map(float, scored.provided)], device=self.ctx.device)
        if self.ctx.dims.dp > 1:
            dist.all_reduce(counts, group=self.ctx.pgs.dp)
        overall = merge_source_sums([{"all": cols} for cols in sums.values()])["all"]
        metrics = {"reward/errors": float(counts[0]), "reward/timeouts": float(counts[1]),
                   "critic/acc/mean": overall["acc"][0] / max(overall["acc"][1], 1),
                   "critic/format/mean": overall["format"][0] / max(overall["format"][1], 1),
                   "response_length/clip_ratio": float(counts[2] / counts[3].clamp(min=1))}
        metrics.update(source_means(sums, "train/{src}/{name}/mean"))
        # accuracy and format only when some rank's reward gave them ("acc" / "pred"), not guessed from scores
        hidden = [name for name, given in zip(("acc", "format"), counts[4:].tolist()) if not given]
        metrics = {k: v for k, v in metrics.items() if not any(f"/{name}/" in k for name in hidden)}
        return scored, metrics
