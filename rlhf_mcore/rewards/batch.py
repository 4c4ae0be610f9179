r"""Score one batch of completions: reward lookup by data_source, errors and time-outs become reward 0.

``score_batch`` is what the trainer calls once per step. Unknown data sources and a bad custom function are
configuration errors and raise before anything runs; a reward that raises, returns garbage, hangs past
``timeout_s`` or crashes its process scores 0 and is counted in ``num_errors`` / ``num_timeouts``.

>>> r = score_batch(["openai/gsm8k", "math"], ["#### 72", "\\boxed{0.5}"], ["72", "\\frac12"], num_workers=1)
>>> r.scores, r.extra["acc"], r.num_errors, r.num_timeouts
([1.0, 1.0], [1.0, 1.0], 0, 0)
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

from rlhf_mcore.rewards.custom import load_custom_reward
from rlhf_mcore.rewards.dispatch import RewardFn, get_reward_fn, split_output
from rlhf_mcore.rewards.workers import Outcome, run_with_deadlines

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RewardResult:
    scores: list[float]  # [B] reward per completion; 0.0 where the reward failed or timed out
    extra: dict[str, list]  # other keys of dict rewards ("acc", "pred"), [B] each, None where absent
    num_errors: int  # calls that raised, returned a malformed value or crashed their worker
    num_timeouts: int  # calls killed after timeout_s


def default_num_workers() -> int:
    """Forked children per batch: the CPUs this process may use, at most 8."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, usable))


def call_reward(fn: RewardFn, data_source: str, solution: str, ground_truth: Any, extra_info: Any) -> Outcome:
    """One reward call as an outcome tuple; never raises."""
    try:
        score, extra = split_output(fn(data_source, solution, ground_truth, extra_info))
    except Exception as err:
        return ("error", f"{type(err).__name__}: {err}")
    return ("ok", score, extra)


def score_batch(
    data_sources: Sequence[str],
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    *,
    custom_fn: RewardFn | str | None = None,
    timeout_s: float = 10.0,
    num_workers: int | None = None,
) -> RewardResult:
    """Rewards for a batch of completions.

    custom_fn: a callable or ``"file.py:function"`` used for every row instead of the data_source lookup.
    num_workers: forked children that score the batch; ``None`` picks ``default_num_workers()``. ``0`` scores
    in this process with no time-out (for debugging only: a hung reward then hangs the caller).
    """
    n = len(solutions)
    extra_infos = [None] * n if extra_infos is None else extra_infos
    columns = {"data_sources": data_sources, "ground_truths": ground_truths, "extra_infos": extra_infos}
    for name, column in columns.items():
        if len(column) != n:
            raise ValueError(f"score_batch: {name} has {len(column)} entries but solutions has {n}")
    fns = resolve_reward_fns(data_sources, custom_fn)
    call = lambda i: call_reward(fns[i], data_sources[i], solutions[i], ground_truths[i], extra_infos[i])
    workers = default_num_workers() if num_workers is None else num_workers
    if workers == 0:
        outcomes = [call(i) for i in range(n)]
    else:
        outcomes = run_with_deadlines(call, n, timeout_s=timeout_s, num_workers=min(workers, max(n, 1)))
    return collect_outcomes(outcomes)


def resolve_reward_fns(data_sources: Sequence[str], custom_fn: RewardFn | str | None) -> list[RewardFn]:
    """One reward function per row; raises ValueError for an unknown data_source or a bad custom_fn."""
    if isinstance(custom_fn, str):
        custom_fn = load_custom_reward(custom_fn)
    if custom_fn is not None:
        if not callable(custom_fn):
            raise ValueError(f"score_batch: custom_fn must be callable or 'file.py:fn' (got {custom_fn!r})")
        return [custom_fn] * len(data_sources)
    by_source = {ds: get_reward_fn(ds) for ds in set(data_sources)}
    return [by_source[ds] for ds in data_sources]


def collect_outcomes(outcomes: Sequence[Outcome]) -> RewardResult:
    """Scores, the union of extra keys (None where a row lacks one) and the failure counts.

    >>> outcomes = [("ok", 1.0, {"acc": 1.0}), ("error", "boom"), ("timeout", "slow"), ("ok", 0.5, {})]
    >>> r = collect_outcomes(outcomes)
    >>> r.scores, r.extra, r.num_errors, r.num_timeouts
    ([1.0, 0.0, 0.0, 0.5], {'acc': [1.0, None, None, None]}, 1, 1)
    """
    keys = sorted({k for o in outcomes if o[0] == "ok" for k in o[2]})
    scores = [o[1] if o[0] == "ok" else 0.0 for o in outcomes]
    extra = {k: [o[2].get(k) if o[0] == "ok" else None for o in outcomes] for k in keys}
    failures = [o for o in outcomes if o[0] != "ok"]
    num_timeouts = sum(o[0] == "timeout" for o in failures)
    if failures:
        logger.warning(
            "rewards: %d of %d calls failed (%d timed out); first: %s",
            len(failures), len(outcomes), num_timeouts, failures[0][1],
        )
    return RewardResult(scores, extra, len(failures) - num_timeouts, num_timeouts)
