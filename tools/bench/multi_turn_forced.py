"""The trainer with forced tool calls: every assistant turn ends at a newline and is read as one calculator
call, so each sample takes several turns whatever the model writes (SmolLM2-135M-Instruct writes no
`<tool_call>` of its own). It measures what turns cost (a generate call per turn, the prefix prefill, the
tool executor, the tool-turn tokens), not learning. tools/gpu/gpu_multi_turn.sh runs it after the real preset.

    python -m tools.bench.multi_turn_forced --config configs/gsm8k_tool_grpo_smollm2.yaml [a.b=value ...]

Any `rlhf_mcore.train` arguments; the parser named by rollout.multi_turn.parser is replaced by the forced one.
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


def main(argv=None) -> int:
    from rlhf_mcore.train import main as train_main

    build.parser_fn = lambda name: (forced_calls, FORCED_STOPS)
    return train_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
