r"""Score one batch of completions: reward lookup by data_source, errors and time-outs become reward 0.

``score_batch`` is what the trainer calls once per step. Unknown data sources and a bad custom function are
configuration errors and raise before anything runs; a reward that raises, returns garbage, hangs past
``timeout_s`` or crashes its process scores 0 and is counted in ``num_errors`` / ``num_timeouts``.

>>> r = score_batch(["openai/gsm8k", "lighteval/MATH"], ["#### 72", r"\boxed{0.5}"], ["72", r"\frac12"], num_workers=0)
>>> r.scores, r.extra["acc"], r.num_errors, r.num_timeouts
([1.0, 1.0], [1.0, 1.0], 0, 0)
"""
from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

from rlhf_mcore.rewards.custom import parse_reward_spec
from rlhf_mcore.rewards.dispatch import RewardFn, get_reward_fn
from rlhf_mcore.rewards.workers import Outcome, RewardPool, run_task

logger = logging.getLogger(__name__)
_SHARED_POOLS: dict[int, RewardPool] = {}  # one pool per worker count, kept for the life of the process
_IN_PROCESS_LOADED: dict[str, Any] = {}  # num_workers=0: custom reward files imported once per process


@dataclass(slots=True)
class RewardResult:
    scores: list[float]  # [B] reward per completion; 0.0 where the reward failed or timed out
    extra: dict[str, list]  # other keys of dict rewards ("acc", "pred"), [B] each, None where absent
    num_errors: int  # calls that raised, returned a malformed value or crashed their worker
    num_timeouts: int  # calls killed after timeout_s


def default_num_workers() -> int:
    """Reward processes: the CPUs this process may use, at most 8."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, usable))


def shared_pool(num_workers: int) -> RewardPool:
    """The process-wide pool with ``num_workers`` workers (started on first use, closed at exit)."""
    if num_workers not in _SHARED_POOLS:
        _SHARED_POOLS[num_workers] = RewardPool(num_workers)
    return _SHARED_POOLS[num_workers]


@atexit.register
def _close_shared_pools() -> None:
    for pool in _SHARED_POOLS.values():
        pool.close()


def score_batch(
    data_sources: Sequence[str],
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    *,
    custom_fn: RewardFn | str | None = None,
    timeout_s: float = 10.0,
    num_workers: int | None = None,
    pool: RewardPool | None = None,
    format_score: float = 0.0,
    budget_s: float | None = None,
) -> RewardResult:
    """Rewards for a batch of completions.

    custom_fn: a module-level function or ``"file.py:function"``, used for every row instead of the
    data_source lookup. num_workers: reward processes (``shared_pool``); ``None`` picks
    ``default_num_workers()``; ``0`` scores in this process with no time-out (debugging only: a hung reward
    then hangs the caller). pool: a RewardPool of your own instead of the shared one. format_score: verl's
    score for a well-formed wrong answer, passed to the built-in rewards (custom functions never get it).
    budget_s: the most the whole batch may take (``RewardPool.run``); unfinished calls then count as time-outs.
    """
    n = len(solutions)
    extra_infos = [None] * n if extra_infos is None else extra_infos
    columns = {"data_sources": data_sources, "ground_truths": ground_truths, "extra_infos": extra_infos}
    for name, column in columns.items():
        if len(column) != n:
            raise ValueError(f"score_batch: {name} has {len(column)} entries but solutions has {n}")
    fns = resolve_reward_fns(data_sources, custom_fn, format_score)
    tasks = [(fns[i], data_sources[i], solutions[i], ground_truths[i], extra_infos[i]) for i in range(n)]
    workers = default_num_workers() if num_workers is None else num_workers
    if pool is None and workers == 0:
        return collect_outcomes([run_task(task, _IN_PROCESS_LOADED) for task in tasks])
    check_sendable(set(fns))
    pool = pool or shared_pool(workers)
    return collect_outcomes(pool.run(tasks, timeout_s, budget_s) if tasks else [])


def resolve_reward_fns(data_sources: Sequence[str], custom_fn: RewardFn | str | None,
                       format_score: float = 0.0) -> list[RewardFn | str]:
    """One reward per row (a function, or a checked ``"file.py:fn"`` spec); raises ValueError when bad."""
    if isinstance(custom_fn, str):
        path, _ = parse_reward_spec(custom_fn)  # the form and the file only: the reward workers import it, once
        if not path.is_file():
            raise ValueError(f"custom reward: file '{path}' does not exist. Give 'path/to/file.py:function_name' "
                             "of a real file.")
        return [custom_fn] * len(data_sources)
    if custom_fn is not None:
        if not callable(custom_fn):
            raise ValueError(f"score_batch: custom_fn must be callable or 'file.py:fn' (got {custom_fn!r})")
        return [custom_fn] * len(data_sources)
    by_source = {ds: with_format_score(get_reward_fn(ds), ds, format_score) for ds in set(data_sources)}
    return [by_source[ds] for ds in data_sources]


def with_format_score(fn: RewardFn, data_source: str, format_score: float) -> RewardFn:
    """``fn`` with ``format_score=`` bound (a picklable partial); ``fn`` itself when the score is 0."""
    if format_score == 0:
        return fn
    if "format_score" not in inspect.signature(fn).parameters:
        raise ValueError(f"reward.format_score: the reward of data_source '{data_source}' takes no format_score "
                         f"(got {format_score}). Set reward.format_score=0 or use reward.format_penalty.")
    return functools.partial(fn, format_score=format_score)


def check_sendable(fns) -> None:
    """Reward functions reach worker processes by module and name: lambdas and closures cannot."""
    for fn in fns:
        try:
            pickle.dumps(fn)
        except Exception as err:
            raise ValueError(
                f"score_batch: reward function {fn!r} cannot be sent to a reward worker ({err}). Define it at "
                "module level, pass custom_fn as 'path/to/file.py:function_name', or use num_workers=0."
            ) from err


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
