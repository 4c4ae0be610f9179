"""The trainer with forced tool calls: every assistant turn ends at a newline and is read as one calculator
call, so each sample takes several turns whatever the model writes (SmolLM2-135M-Instruct writes no
`<tool_call>` of its own). It measures what turns cost (a generate call per turn, the prefix prefill, the
tool executor, the tool-turn tokens), not learning. tools/gpu/gpu_multi_turn.sh runs it after the real preset.

    python -m tools.bench.multi_turn_forced --config configs/gsm8k_tool_grpo_smollm2.yaml [a.b=value ...]
        [--tool-sleep-ms 50-500]

Any `rlhf_mcore.train` arguments; the parser named by rollout.multi_turn.parser is replaced by the forced one.
`--tool-sleep-ms LO-HI`: every in-process tool call first sleeps a uniform LO-HI ms (issue 37's tool latency).
"""
from __future__ import annotations

import sys

import rlhf_mcore.rollout.modes.build as build
from rlhf_mcore.agent.parsers import ToolCall

FORCED_STOPS = ("\n",)  # a turn ends at its first newline


def forced_calls(text: str) -> list:
    """One calculator call per turn, its expression from the turn's length (a real call, a real result).

    >>> forced_calls("abc")
    [ToolCall(name='calculator', arguments={'expression': '3 * 7'})]
    """
    return [ToolCall("calculator", {"expression": f"{len(text)} * 7"})]


def sleep_range(spec: str) -> tuple[float, float]:
    """"LO-HI" milliseconds -> (lo, hi) seconds.

    >>> sleep_range("50-500")
    (0.05, 0.5)
    """
    lo, hi = (float(x) / 1000 for x in spec.split("-"))
    return lo, hi


def slow_tools(lo: float, hi: float):
    """`load_tools` whose in-process tools first sleep a uniform [lo, hi] seconds per call (a tool's latency: a
    search, a sandbox, a remote service), with a fixed seed."""
    import dataclasses
    import random
    import time

    import rlhf_mcore.agent.tools as tools

    load, draw = tools.load_tools, random.Random(0)

    def sleepy(fn):
        def call(arguments, context):
            time.sleep(draw.uniform(lo, hi))
            return fn(arguments, context)
        return call

    def load_slow(names, tools_file):
        return {name: dataclasses.replace(t, fn=sleepy(t.fn)) if not t.sandboxed else t
                for name, t in load(names, tools_file).items()}
    tools.load_tools = load_slow


def main(argv=None) -> int:
    from rlhf_mcore.train import main as train_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--tool-sleep-ms" in argv:  # e.g. --tool-sleep-ms 50-500
        k = argv.index("--tool-sleep-ms")
        slow_tools(*sleep_range(argv[k + 1]))
        del argv[k:k + 2]
    build.parser_fn = lambda name: (forced_calls, FORCED_STOPS)
    return train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
