"""Reduce what the loss functions reported (last pipeline stage, every DP rank) into one dict of floats.

Per-micro-batch metrics are averaged; `<role>/loss_sum` and `<role>/loss_count` become the exact global
loss `<role>/loss` = sum(loss_sum) / sum(count). One all_gather_object per phase: the only host sync.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def local_summary(outputs: list[dict]) -> dict[str, tuple[float, float]]:
    """{key: (sum over micro-batches, number of micro-batches)}; loss sums and counts are plain sums."""
    summary: dict[str, tuple[float, float]] = {}
    for out in outputs:
        for key, value in out.items():
            total, num = summary.get(key, (0.0, 0.0))
            summary[key] = (total + float(torch.as_tensor(value).float().mean()), num + 1)
    return summary


def combine(summaries: list[dict[str, tuple[float, float]]]) -> dict[str, float]:
    """Merge the summaries of all contributing ranks into global metrics.

    >>> combine([{"a/loss_sum": (3.0, 1), "a/loss_count": (2.0, 1), "a/x": (1.0, 2)},
    ...          {"a/loss_sum": (1.0, 1), "a/loss_count": (2.0, 1), "a/x": (4.0, 2)}])
    {'a/x': 1.25, 'a/loss': 1.0}
    """
    totals: dict[str, tuple[float, float]] = {}
    for summary in summaries:
        for key, (total, num) in summary.items():
            t, n = totals.get(key, (0.0, 0.0))
            totals[key] = (t + total, n + num)
    result = {k: t / max(n, 1) for k, (t, n) in totals.items() if not k.endswith(("/loss_sum", "/loss_count"))}
    for key in [k for k in totals if k.endswith("/loss_sum")]:
        role = key[: -len("/loss_sum")]
        result[f"{role}/loss"] = totals[key][0] / max(totals[f"{role}/loss_count"][0], 1.0)
    return result


def reduce_outputs(outputs: list[dict], ctx) -> dict[str, float]:
    """Global metrics on every rank. Contributors: last stage, TP rank 0 (TP ranks hold copies)."""
    mine = local_summary(outputs) if ctx.is_last_stage and ctx.tp_rank == 0 else {}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return combine([g for g in gathered if g])
