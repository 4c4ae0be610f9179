"""Reduce what the loss functions reported (last pipeline stage, every DP rank) into one dict of floats,
weighted like the loss, so a metric does not depend on micro-batch size, packing or the DP/TP/PP layout.

A report is a dict {name: entry} per micro-batch (or per optimizer step). An entry is a `(value, weight)`
pair (`weighted`): the loss functions pair each mean with the number of things it is a mean over (the
micro-batch's valid tokens for token-level metrics, its rows for row-level ones). A bare value has weight 1
(e.g. grad_norm, one per optimizer step). How a name is reduced over micro-batches, optimizer steps and
ranks is one table, REDUCTIONS, matched on the end of the name (first match wins):

  /loss_sum, /loss_count  sum    -> <role>/loss = sum(loss_sum) / sum(loss_count), the exact global loss
  _total                  sum    over entries and ranks (e.g. async/samples_carried_total: DP replicas' counts)
  _max, /max              max    over entries of weight > 0 (e.g. actor/ratio_max, num_turns/max)
  _min, /min              min    over entries of weight > 0
  (anything else)         mean   sum(value * weight) / sum(weight): a token mean of every micro-batch
                                 becomes the token mean of the whole update over all ranks

A metric with total weight 0 (no valid token anywhere) reads 0. One all_gather_object per phase and one
device-to-host copy per device: the only host syncs.
"""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

Partial = tuple[float, float]  # (total, weight) of one metric over some entries


class Reduction(NamedTuple):
    entry: Callable[[float, float], float]  # (value, weight) of one entry -> its total
    fold: Callable[[float, float], float]  # merges two totals
    finish: Callable[[float, float], float]  # (total, summed weight) -> the metric


_INF = float("inf")
REDUCERS: dict[str, Reduction] = {
    "sum": Reduction(lambda v, w: v, operator.add, lambda t, w: t),
    "mean": Reduction(operator.mul, operator.add, lambda t, w: t / w if w > 0 else 0.0),
    "max": Reduction(lambda v, w: v if w > 0 else -_INF, max, lambda t, w: t if w > 0 else 0.0),
    "min": Reduction(lambda v, w: v if w > 0 else _INF, min, lambda t, w: t if w > 0 else 0.0),
}
REDUCTIONS: tuple[tuple[str, str], ...] = (("/loss_sum", "sum"), ("/loss_count", "sum"), ("_total", "sum"),
                                           ("_max", "max"), ("_min", "min"), ("/max", "max"), ("/min", "min"))


def reduction_of(name: str) -> Reduction:
    """The REDUCERS entry for a metric name (REDUCTIONS, else a weighted mean).

    >>> [reduction_of(n) is REDUCERS[k] for n, k in (("actor/loss_sum", "sum"), ("actor/ratio_max", "max"),
    ...                                              ("actor/pg_loss", "mean"))]
    [True, True, True]
    """
    return REDUCERS[next((kind for suffix, kind in REDUCTIONS if name.endswith(suffix)), "mean")]


def weighted(metrics: dict, weight) -> dict:
    """Pair every metric of `metrics` with the same weight (e.g. the micro-batch's valid-token count)."""
    return {k: (v, weight) for k, v in metrics.items()}


def _to_floats(tensors: list[torch.Tensor]) -> list[float]:
    """Scalars of many (possibly device) tensors with one stack and copy per device."""
    by_device: dict = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out = [0.0] * len(tensors)
    for index in by_device.values():
        for i, value in zip(index, torch.stack([tensors[i] for i in index]).tolist()):
            out[i] = value
    return out


def merge(summary: dict[str, Partial], name: str, part: Partial) -> None:
    """Fold a partial (total, weight) of metric `name` into `summary`, in place."""
    if name in summary:
        (total, weight), fold = summary[name], reduction_of(name).fold
        part = (fold(total, part[0]), weight + part[1])
    summary[name] = part


def local_summary(outputs: list[dict]) -> dict[str, Partial]:
    """{name: (total, weight)} over this rank's reports (see the module docstring)."""
    names, tensors = [], []
    for out in outputs:
        for name, entry in out.items():
            value, weight = entry if isinstance(entry, tuple) else (entry, 1.0)
            names.append(name)
            value = torch.as_tensor(value).float().mean()
            tensors += [value, torch.as_tensor(weight).float().reshape(()).to(value.device)]
    floats = _to_floats(tensors)
    summary: dict[str, Partial] = {}
    for i, name in enumerate(names):
        value, weight = floats[2 * i], floats[2 * i + 1]
        merge(summary, name, (reduction_of(name).entry(value, weight), weight))
    return summary


def combine(summaries: list[dict[str, Partial]]) -> dict[str, float]:
    """Merge the summaries of all contributing ranks into global metrics.

    >>> combine([{"a/loss_sum": (3.0, 1), "a/loss_count": (2.0, 1), "a/x": (1.0, 2), "a/r_max": (5.0, 2)},
    ...          {"a/loss_sum": (1.0, 1), "a/loss_count": (2.0, 1), "a/x": (8.0, 6), "a/r_max": (9.0, 3)}])
    {'a/x': 1.125, 'a/r_max': 9.0, 'a/loss': 1.0}
    """
    totals: dict[str, Partial] = {}
    for summary in summaries:
        for name, part in summary.items():
            merge(totals, name, part)
    result = {k: reduction_of(k).finish(*p) for k, p in totals.items() if not k.endswith(("/loss_sum", "/loss_count"))}
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
