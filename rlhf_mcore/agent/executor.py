"""Run many tool calls at once and turn every outcome into a `ToolResult` the model can read.

`ToolExecutor.run` never raises and never waits past a call's time-out (plus the start of its process):
- sandboxed tools (``python``, custom tools by default) run each call in a fresh sandbox process
  (`launch.run_sandboxed`), started from a bounded pool of ``workers`` threads; a call that overruns is
  killed with its whole process group. Children die with the trainer (``PR_SET_PDEATHSIG`` in the
  sandbox), and the pool's threads live as long as the executor, so that signal fires only then;
- in-process tools (``sandboxed=False``: ``calculator``) run in a daemon thread each; one that overruns is
  reported as a time-out and its thread is abandoned (it cannot be killed: keep such tools fast and pure).

Error kinds (`ToolResult.error`): ``"parse"`` (the call could not be read), ``"unknown_tool"``,
``"invalid_arguments"`` (a required argument missing or of the wrong JSON type), ``"exception"`` (the tool
raised), ``"timeout"``, ``"crash"`` (the process died: ``os._exit``, a signal, a limit, an over-long result).
A cut output is not an error (``truncated``). Every result the model reads, errors and return values
included, is at most ``max_output_chars`` characters, the cut marker included. `count_kinds` gives the
per-kind counts for metrics.

>>> from rlhf_mcore.agent.parsers import ToolCall, ParseError
>>> from rlhf_mcore.agent.tools import load_tools
>>> ex = ToolExecutor(load_tools(["calculator"], None), timeout_s=5, max_output_chars=100, memory_mb=512, workers=2)
>>> [(r.text, r.error) for r in ex.run([ToolCall("calculator", {"expression": "6*7"}), ParseError("bad JSON")])]
[('42', None), ('Error: the tool call could not be parsed: bad JSON', 'parse')]
>>> ex.close()
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from rlhf_mcore.agent.launch import Finished, SandboxLimits, cut_text, run_sandboxed
from rlhf_mcore.agent.parsers import ParseError, ToolCall
from rlhf_mcore.agent.schema import Tool

ERROR_KINDS = ("parse", "unknown_tool", "invalid_arguments", "exception", "timeout", "crash")
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
               "array": list, "null": type(None)}


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str  # what the model reads as the tool's answer (an error message on failure)
    error: str | None  # None, or one of ERROR_KINDS
    timed_out: bool
    seconds: float
    truncated: bool = False  # the output was cut to max_output_chars


def count_kinds(results: Sequence[ToolResult]) -> dict[str, int]:
    """Calls per outcome: every error kind plus ``ok`` and ``truncated`` (zeros included).

    >>> count_kinds([ToolResult("1", None, False, 0.1), ToolResult("E", "timeout", True, 2.0)])["timeout"]
    1
    """
    counts = Counter(r.error or "ok" for r in results)
    return {"ok": counts["ok"], **{k: counts[k] for k in ERROR_KINDS}, "truncated": sum(r.truncated for r in results)}


class ToolExecutor:
    """Runs tool calls concurrently on ``workers`` threads under the given limits."""

    def __init__(self, tools: Mapping[str, Tool], timeout_s: float, max_output_chars: int, memory_mb: int,
                 workers: int, disk_mb: int = 64):
        if timeout_s <= 0 or max_output_chars < 1 or memory_mb < 64 or workers < 1:
            raise ValueError(f"ToolExecutor: need timeout_s > 0, max_output_chars >= 1, memory_mb >= 64 and "
                             f"workers >= 1 (got {timeout_s}, {max_output_chars}, {memory_mb}, {workers})")
        self.tools = dict(tools)
        self.limits = SandboxLimits(float(timeout_s), int(memory_mb), int(max_output_chars), disk_mb=int(disk_mb))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool")

    def run(self, calls: Sequence[ToolCall | ParseError],
            contexts: Sequence[Mapping | None] | None = None) -> list[ToolResult]:
        """One result per call, in order. ``contexts[i]``: call i's sample's tool kwargs (tool name -> that
        tool's kwargs, from verl's ``extra_info.tools_kwargs``); the tool receives its own entry as context."""
        contexts = list(contexts) if contexts is not None else [None] * len(calls)
        if len(contexts) != len(calls):
            raise ValueError(f"ToolExecutor.run: {len(calls)} calls but {len(contexts)} contexts")
        futures = [self.submit(call, ctx) for call, ctx in zip(calls, contexts)]
        return [f.result() for f in futures]

    def submit(self, call: ToolCall | ParseError, tools_kwargs: Mapping | None = None) -> Future:
        """`run_one` on the pool, at once: a future of its `ToolResult` (it never raises)."""
        return self._pool.submit(self.run_one, call, tools_kwargs)

    def run_one(self, call: ToolCall | ParseError, tools_kwargs: Mapping | None = None) -> ToolResult:
        start = time.monotonic()
        try:
            result = self._run(call, tools_kwargs or {}, start)
        except Exception as err:  # noqa: BLE001 - the executor's own failure (e.g. no process could start)
            result = _failed("crash", f"the tool could not be run ({type(err).__name__}: {err})", start)
        text, cut = cut_text(result.text, self.limits.max_output_chars)
        return replace(result, text=text, truncated=result.truncated or cut)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, call, tools_kwargs: Mapping, start: float) -> ToolResult:
        if isinstance(call, ParseError):
            return _failed("parse", f"the tool call could not be parsed: {call.message}", start)
        tool = self.tools.get(call.name)
        if tool is None:
            return _failed("unknown_tool", f"unknown tool '{call.name}'. Available tools: "
                                           f"{', '.join(sorted(self.tools))}.", start)
        problem = argument_problem(call.arguments, tool.parameters)
        if problem:
            return _failed("invalid_arguments", f"invalid arguments for '{tool.name}': {problem}", start)
        context = dict(tools_kwargs.get(tool.name) or {})
        if tool.sandboxed:
            return _from_finished(run_sandboxed(tool.origin, tool.name, call.arguments, context, self.limits))
        return self._run_in_thread(tool, call.arguments, context, start)

    def _run_in_thread(self, tool: Tool, arguments: dict, context: dict, start: float) -> ToolResult:
        box: dict = {}

        def target():
            try:
                value = tool.fn(arguments, context)
                box["value"] = value if isinstance(value, str) else json.dumps(value, default=str)
            except BaseException as err:  # noqa: BLE001 - the tool's error is the model's result
                box["error"] = f"{type(err).__name__}: {err}"

        worker = threading.Thread(target=target, daemon=True, name=f"tool-{tool.name}")
        worker.start()
        worker.join(self.limits.timeout_s)
        if worker.is_alive():
            return _failed("timeout", f"the call exceeded its time-out of {self.limits.timeout_s:g} s", start,
                           timed_out=True)
        if "error" in box:
            return _failed("exception", box["error"], start)
        return ToolResult(box["value"], None, False, time.monotonic() - start)


def argument_problem(arguments: dict, schema: dict) -> str:
    """'' when the required properties are there with their JSON types (only the top level is checked)."""
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument '{missing[0]}' (expected: {', '.join(props) or 'none'})"
    for key, value in arguments.items():
        kind = props.get(key, {}).get("type")
        kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if k in _JSON_TYPES]
        bad_bool = isinstance(value, bool) and "boolean" not in kinds
        if kinds and (bad_bool or not isinstance(value, tuple(_JSON_TYPES[k] for k in kinds))):
            return f"argument '{key}' must be of JSON type {kind} (got {type(value).__name__})"
    return ""


def _failed(kind: str, message: str, start: float, timed_out: bool = False) -> ToolResult:
    return ToolResult(f"Error: {message}", kind, timed_out, time.monotonic() - start)


def _from_finished(done: Finished) -> ToolResult:
    """A sandbox process's end as the model's result: its output, then the value or the error."""
    if done.status == "ok":
        return ToolResult(done.output + done.value, None, False, done.seconds, done.truncated)
    message = {"timeout": f"Error: {done.error}.", "crash": f"Error: {done.error}."}.get(done.status, "")
    if done.status == "exception" and done.error not in done.output:
        message = f"Error: {done.error}"
    text = "\n".join(part for part in (done.output.rstrip("\n"), message) if part)
    return ToolResult(text, done.status, done.status == "timeout", done.seconds, done.truncated)
