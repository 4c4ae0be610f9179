"""The executor: calls run concurrently, a hang in one blocks no other, every failure is a counted result,
and a sandbox process dies with the process that started it (also when that one is killed -9)."""
from __future__ import annotations

import time

import pytest

from rlhf_mcore.agent.executor import ToolExecutor, count_kinds
from rlhf_mcore.agent.parsers import ParseError, ToolCall
from rlhf_mcore.agent.schema import Tool
from rlhf_mcore.agent.tools import load_tools

SLEEP = ToolCall("python", {"code": "import time\ntime.sleep(0.5)\nprint('slept')"})
HANG = ToolCall("python", {"code": "while True:\n    pass"})


def executor(workers: int = 4, timeout_s: float = 3.0, tools=None) -> ToolExecutor:
    return ToolExecutor(tools or load_tools(["python", "calculator"], None), timeout_s=timeout_s,
                        max_output_chars=200, memory_mb=512, workers=workers)


def test_calls_run_concurrently():
    with executor(workers=4) as ex:
        ex.run([ToolCall("calculator", {"expression": "1"})])
        start = time.monotonic()
        results = ex.run([SLEEP] * 8)
        wall = time.monotonic() - start
    assert [r.text for r in results] == ["slept\n"] * 8
    assert wall < 0.6 * 8 * 0.5  # serial would take 4 s; 4 workers take ~1 s plus process starts
    assert all(r.seconds >= 0.5 for r in results)


def test_a_hang_blocks_no_other_call():
    with executor(workers=4, timeout_s=3.0) as ex:
        start = time.monotonic()
        results = ex.run([HANG] + [SLEEP] * 6)
        wall = time.monotonic() - start
    assert results[0].error == "timeout" and results[0].timed_out and 3.0 <= results[0].seconds < 4.0
    # none waited for the hung call: each finished inside its own limit (a sandbox's start can take a second or
    # more on a loaded 2-core machine), and the batch ended when the hung call's timeout fired
    assert all(r.error is None and r.seconds < 3.0 for r in results[1:]), [(r.error, r.seconds) for r in results]
    assert wall < 3.0 + 1.5


def test_an_in_process_tool_that_hangs_is_a_timeout():
    stop = []

    def stuck(arguments, context):
        while not stop:
            time.sleep(0.01)
        return "late"

    tools = {"stuck": Tool("stuck", "d", {"type": "object", "properties": {}}, stuck, sandboxed=False),
             **load_tools(["calculator"], None)}
    with executor(workers=2, timeout_s=0.5, tools=tools) as ex:
        start = time.monotonic()
        hung, fine = ex.run([ToolCall("stuck", {}), ToolCall("calculator", {"expression": "2**8"})])
        assert time.monotonic() - start < 1.5
        stop.append(True)
    assert hung.error == "timeout" and fine.text == "256"


def test_every_failure_is_a_counted_result():
    calls = [ParseError("the <tool_call> block is not valid JSON"), ToolCall("search", {}),
             ToolCall("python", {"code": 3}), ToolCall("python", {}), ToolCall("calculator", {"expression": "x"}),
             ToolCall("python", {"code": "import os\nos._exit(1)"}), ToolCall("python", {"code": "print('ok')"}),
             ToolCall("python", {"code": "print('y' * 1000)"})]
    with executor(workers=3) as ex:
        results = ex.run(calls)
    kinds = [r.error for r in results]
    assert kinds == ["parse", "unknown_tool", "invalid_arguments", "invalid_arguments", "exception", "crash", None,
                     None]
    assert results[1].text == "Error: unknown tool 'search'. Available tools: calculator, python."
    assert results[4].text.startswith("Error: ValueError: unknown name 'x'")
    assert results[7].truncated and len(results[7].text) < 300
    assert count_kinds(results) == {"ok": 2, "parse": 1, "unknown_tool": 1, "invalid_arguments": 2, "exception": 1,
                                    "timeout": 0, "crash": 1, "truncated": 1}
    assert all(r.text for r in results)


def test_contexts_must_match_calls():
    with executor(workers=1) as ex:
        assert ex.run([]) == []
        with pytest.raises(ValueError, match="2 calls but 1 contexts"):
            ex.run([SLEEP, SLEEP], [None])


def test_every_result_of_every_kind_fits_a_small_budget():
    """At max_output_chars=40 every error kind (parse, unknown tool, bad arguments, the tool's exception, a time-out,
    a crash), a long output, and the too-many-calls result of a multi-turn turn are at most 40 characters, the cut
    marker included; each still says what it is where it can."""
    from types import SimpleNamespace

    from rlhf_mcore.rollout.modes.multi_turn import run_calls

    def slow(arguments, context):
        time.sleep(3)
        return "late"

    tools = {"slow": Tool("slow", "d", {"type": "object", "properties": {}}, slow, sandboxed=False),
             **load_tools(["python", "calculator"], None)}
    calls = [ParseError("the <tool_call> block is not valid JSON " * 3), ToolCall("search" * 20, {}),
             ToolCall("python", {"code": 3}), ToolCall("calculator", {"expression": "x" * 80}), ToolCall("slow", {}),
             ToolCall("python", {"code": "import os\nos._exit(1)"}), ToolCall("python", {"code": "print('y' * 1000)"})]
    with ToolExecutor(tools, timeout_s=2.0, max_output_chars=40, memory_mb=512, workers=4) as ex:
        # 2 s: the python sandbox that crashes must start and exit within it on a loaded 2-core machine (it read
        # "timeout" at 0.5 s in a CI run); "slow" sleeps past it
        results = ex.run(calls)
        env = SimpleNamespace(executor=ex, options=SimpleNamespace(max_tool_response_chars=40))
        per_row = run_calls(env, {0: [ToolCall("calculator", {"expression": "1+1"})] * 3}, 1, {})
    assert [r.error for r in results] == ["parse", "unknown_tool", "invalid_arguments", "exception", "timeout",
                                          "crash", None]
    assert all(len(r.text) <= 40 for r in results), [(r.error, len(r.text)) for r in results]
    assert [error for _, error, _ in per_row[0]] == [None, "too_many_calls", "too_many_calls"]
    assert all(len(text) <= 40 for text, _, _ in per_row[0]), per_row
    assert all(r.text.startswith("Error") for r in results[:6])
