"""DAPO's dynamic sampling (verl `algorithm.filter_groups`): a group whose `metric` is equal on all n samples
has zero advantage under a group baseline and carries no gradient. Such groups are dropped, and more prompt
batches are generated until the step holds `data.train_batch_size` groups; exactly that many are trained,
the first kept ones in (round, global prompt) order (the last round's excess is dropped, as in verl).

Each round is one ordinary prompt batch: every DP rank generates and scores its shard (`data.sampler`). One
all_gather per round shares the ranks' keep flags, so every rank sees the same global flags, runs the same
number of rounds and picks the same groups. At the end one all_gather per batch field sends each picked
group to the rank that trains it (rank d: groups d*P .. d*P+P-1 of the picked list, P = train_batch_size/dp).
The sampler advances by every round it drew, so a checkpoint resumes at the next unseen prompt batch.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from rlhf_mcore.data.packing import ROW_FIELDS
from rlhf_mcore.logs import timer
from rlhf_mcore.trainer.guards import RunStopped
from rlhf_mcore.trainer.rollout_memory import sync_weights
from rlhf_mcore.trainer.row_fields import uniform_row_fields
from rlhf_mcore.trainer.step_batch import StepBatch

SUMMED_METRICS = ("reward/errors", "reward/timeouts")  # counts: added over rounds; the rest are means


class FilterGroupsExhausted(RunStopped):
    """algorithm.filter_groups.max_num_gen_batches rounds did not fill the batch (every rank stops together)."""


def keep_groups(values: torch.Tensor, n: int) -> torch.Tensor:
    """[G * n] per-sample values, prompt g's samples at g*n .. g*n+n-1 -> [G] bool: the values differ within
    the group (verl: std > 0; exact here, and NaN never counts as a spread). A group of one is always kept.

    >>> keep_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), 2).tolist()
    [False, True, False]
    >>> keep_groups(torch.tensor([0.0, float("nan")]), 2).tolist(), keep_groups(torch.tensor([3.0]), 1).tolist()
    ([False], [True])
    """
    groups = values.float().view(-1, n)
    if n == 1:
        return torch.ones(groups.size(0), dtype=torch.bool)
    return groups.amax(1) > groups.amin(1)


def select_groups(keep: list[list[bool]], num_groups: int) -> list[tuple[int, int]]:
    """The first `num_groups` kept groups as (round, global prompt position), rounds in order.

    >>> select_groups([[True, False, True, False], [False, True, True, True]], 3)
    [(0, 0), (0, 2), (1, 1)]
    """
    picked = [(r, g) for r, flags in enumerate(keep) for g, kept in enumerate(flags) if kept]
    return picked[:num_groups]


def exchange_plan(picked: list[tuple[int, int]], per_rank: int, dp: int) -> tuple[list[list], list[int]]:
    """How the picked groups reach the rank that trains them. `per_rank` prompts per rank and round.
    Returns (sends, index): sends[q] = the (round, local prompt) of rank q's picked groups in pick order;
    index[k] = where picked group k lies in the all-gather of every rank's sends, each padded to the longest.

    >>> exchange_plan([(0, 0), (0, 3), (1, 2)], per_rank=2, dp=2)
    ([[(0, 0)], [(0, 1), (1, 0)]], [0, 2, 3])
    """
    sends: list[list[tuple[int, int]]] = [[] for _ in range(dp)]
    owner = []
    for r, g in picked:
        q = g // per_rank
        owner.append((q, len(sends[q])))
        sends[q].append((r, g % per_rank))
    width = max(len(s) for s in sends)
    return sends, [q * width + j for q, j in owner]


def merge_round_metrics(rounds: list[dict]) -> dict:
    """The scorer's metrics of every round of the step: counts added, maxima and minima (`/max`, `/min`:
    multi-turn's num_turns/max) taken over the rounds, means averaged (rounds are equal-sized).

    >>> merge_round_metrics([{"reward/errors": 1.0, "critic/acc/mean": 0.5, "num_turns/max": 3.0},
    ...                      {"reward/errors": 2.0, "critic/acc/mean": 1.0, "num_turns/max": 2.0}])
    {'reward/errors': 3.0, 'critic/acc/mean': 0.75, 'num_turns/max': 3.0}
    """
    keys = dict.fromkeys(k for m in rounds for k in m)
    extreme = {"/max": max, "/min": min}
    return {k: sum(m.get(k, 0.0) for m in rounds) if k in SUMMED_METRICS
            else extreme[k[-4:]](m[k] for m in rounds if k in m) if k[-4:] in extreme
            else sum(m[k] for m in rounds if k in m) / sum(k in m for m in rounds) for k in keys}


def group_rows(groups: list[int], n: int, device=None) -> torch.Tensor:
    """Row indices of groups (prompt i's samples are rows i*n .. i*n+n-1).

    >>> group_rows([2, 0], 3).tolist()
    [6, 7, 8, 0, 1, 2]
    """
    return (torch.tensor(groups, dtype=torch.long).view(-1, 1) * n + torch.arange(n)).view(-1).to(device)


def gather_flags(keep: torch.Tensor, ctx) -> list[bool]:
    """This rank's [P] keep flags -> the global [dp * P] flags in prompt order (one all_gather)."""
    if ctx.dims.dp == 1:
        return keep.tolist()
    mine = keep.to(device=ctx.device, dtype=torch.float32)
    parts = [torch.empty_like(mine) for _ in range(ctx.dims.dp)]
    dist.all_gather(parts, mine, group=ctx.pgs.dp)
    return [bool(v) for v in torch.cat(parts).tolist()]


def exchange(rounds: list[StepBatch], picked: list[tuple[int, int]], per_rank: int, n: int, ctx) -> dict:
    """This rank's training rows, every field of the round batches: picked groups d*P .. d*P+P-1 in pick order
    (d = DP rank), gathered from the ranks that generated them."""
    sends, index = exchange_plan(picked, per_rank, ctx.dims.dp)
    width, mine = max(len(s) for s in sends), sends[ctx.dp_rank]
    first = ctx.dp_rank * per_rank
    images = uniform_row_fields(rounds, ctx)  # a vision LM's: one shape over the rounds and the ranks
    out = {}
    for key in [*(k for k in rounds[0] if k not in ROW_FIELDS), *images[0]]:
        rows = torch.cat([f[key] if key in f else b[key] for b, f in zip(rounds, images)])  # [R * P * n, ...]
        local = rows[group_rows([r * per_rank + i for r, i in mine], n, rows.device)]
        if ctx.dims.dp > 1:
            local = torch.cat([local, local.new_zeros(((width - len(mine)) * n, *local.shape[1:]))])
            parts = [torch.empty_like(local) for _ in range(ctx.dims.dp)]
            dist.all_gather(parts, local, group=ctx.pgs.dp)
            local = torch.cat(parts)
        out[key] = local[group_rows(index[first:first + per_rank], n, local.device)]
    return out


def fill_batch(run, first: tuple, next_round: Callable[[int], tuple], timings: dict) -> tuple[StepBatch, dict]:
    """(step batch, metrics) of a step from its first round `first` = (batch, reward metrics, per-sample values),
    drawing `next_round(round_index)` (phases 1-2 on the next prompt batch) until the batch is full. Without
    algorithm.filter_groups.enable: the first round, as it is."""
    batch, metrics, values = first
    fg, n = run.cfg.algorithm.filter_groups, run.cfg.rollout.n
    if not fg.enable:
        return batch, metrics
    target, per_rank = run.cfg.data.train_batch_size, batch.num_rows // n
    rounds, round_metrics, keep = [], [], []
    while True:
        rounds.append(batch)
        round_metrics.append(metrics)
        keep.append(gather_flags(keep_groups(values[fg.metric], n), run.ctx))
        num_kept = sum(map(sum, keep))
        if num_kept >= target:
            break
        if 0 < fg.max_num_gen_batches <= len(rounds):
            raise FilterGroupsExhausted(
                f"algorithm.filter_groups.max_num_gen_batches: {len(rounds)} generation rounds found {num_kept} of "
                f"data.train_batch_size={target} groups whose {fg.metric} differs among their samples (got "
                f"{fg.max_num_gen_batches}). Raise it (0 = no limit), or use easier/harder prompts or another metric.")
        with timer("sync_weights", timings):
            sync_weights(run)  # the engine released its memory after the last round: resume it
        batch, metrics, values = next_round(len(rounds))
    picked = select_groups(keep, target)
    batch = rounds[0].replace(**exchange(rounds, picked, per_rank, n, run.ctx))
    batch = batch.replace(group_index=run.group_index(per_rank))
    counts = {"num_gen_batches": len(rounds), "num_kept": num_kept, "num_filtered": len(rounds) * target - num_kept}
    return batch, {**merge_round_metrics(round_metrics), **{f"filter_groups/{k}": float(v) for k, v in counts.items()}}
