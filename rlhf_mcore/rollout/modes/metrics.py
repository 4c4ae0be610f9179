"""Per-step metrics of a multi-turn rollout (verl's num_turns/*), as `(value, weight)` reports for
`rlhf_mcore.trainer.metrics` to reduce over the DP replicas like any loss metric."""
from __future__ import annotations

import torch

from rlhf_mcore.rollout.types import TurnInfo


def turn_report(turns: TurnInfo) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (value, weight)}: turns and tool calls per sample and the fraction of samples that called a tool
    (`tool/call_rate`; weight: rows), tool error and time-out rates (weight: tool calls).

    >>> r = turn_report(TurnInfo(spans=[[(0, 1)], [(0, 1), (2, 3), (4, 5)]], tool_calls=[0, 2],
    ...                          tool_errors=[0, 1], tool_timeouts=[0, 0]))
    >>> {k: (round(float(v), 3), float(w)) for k, (v, w) in r.items()}["num_turns/mean"], float(r["tool/error_rate"][0])
    ((2.0, 2.0), 0.5)
    >>> float(r["tool/call_rate"][0])
    0.5
    """
    num_turns = torch.tensor(turns.num_turns, dtype=torch.float32)
    calls = torch.tensor(turns.tool_calls, dtype=torch.float32)
    rows = torch.tensor(float(num_turns.numel()))
    num_calls = calls.sum()
    per_call = num_calls.clamp(min=1.0)
    empty = torch.zeros(())
    return {
        "num_turns/mean": (num_turns.mean() if num_turns.numel() else empty, rows),
        "num_turns/max": (num_turns.max() if num_turns.numel() else empty, rows),
        "num_turns/min": (num_turns.min() if num_turns.numel() else empty, rows),
        "tool_calls/mean": (calls.mean() if calls.numel() else empty, rows),
        "tool_calls/max": (calls.max() if calls.numel() else empty, rows),
        "tool/call_rate": ((calls > 0).float().mean() if calls.numel() else empty, rows),
        "tool/error_rate": (torch.tensor(float(sum(turns.tool_errors))) / per_call, num_calls),
        "tool/timeout_rate": (torch.tensor(float(sum(turns.tool_timeouts))) / per_call, num_calls),
    }
