"""Tool-call parsers: the model's text of one turn -> its tool calls, registered by format name.

A parser is ``fn(text) -> list[ToolCall | ParseError]``, one entry per call block in order; a block that
cannot be read is a `ParseError` saying what was wrong, so the model gets that as the call's result.
Adding a format is one registered function.

``hermes`` is what the Qwen2.5 / Qwen3 chat templates ask for (and most hermes-style templates):

>>> parse('<tool_call>\\n{"name": "python", "arguments": {"code": "print(1)"}}\\n</tool_call>')
[ToolCall(name='python', arguments={'code': 'print(1)'})]
>>> parse('<tool_call>{"name": "python", "arguments": {"code": }}</tool_call>')[0].message
'the <tool_call> block is not valid JSON: Expecting value at line 1 column 42'
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Union

from rlhf_mcore.registry import Registry


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True, slots=True)
class ParseError:
    message: str  # what was wrong, written for the model
    raw: str = field(default="", repr=False)  # the block as the model wrote it


Parsed = Union[ToolCall, ParseError]
TOOL_CALL_PARSERS: Registry[Callable[[str], list[Parsed]]] = Registry("tool-call parser")
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def parse(text: str, fmt: str = "hermes") -> list[Parsed]:
    """The tool calls of one assistant turn in format `fmt` (an entry of TOOL_CALL_PARSERS)."""
    return TOOL_CALL_PARSERS.get(fmt)(text)


@TOOL_CALL_PARSERS.register("hermes")
def parse_hermes(text: str) -> list[Parsed]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; ``arguments`` may also be a JSON
    string holding the object (some models write it so). Text outside the blocks is ignored.

    >>> parse_hermes('a <tool_call>{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}</tool_call> b')
    [ToolCall(name='f', arguments={'x': 1})]
    >>> parse_hermes('<tool_call>{"name": "f", "arguments": {}}')[0].message
    'the <tool_call> block is not closed with </tool_call>'
    """
    calls: list[Parsed] = []
    for match in _HERMES_BLOCK.finditer(text):
        body, closed = match.group(1), bool(match.group(2))
        if not closed:
            calls.append(ParseError("the <tool_call> block is not closed with </tool_call>", match.group(0)))
        else:
            calls.append(read_call_json(body.strip(), match.group(0), "the <tool_call> block"))
    return calls


parse_hermes.stop_strings = ("</tool_call>",)  # where a call ends: a rollout may stop generating there


def read_call_json(body: str, raw: str, where: str) -> Parsed:
    """``{"name": str, "arguments": object | JSON string of one}`` -> ToolCall, or a ParseError naming the fault."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return ParseError(f"{where} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}", raw)
    if not isinstance(obj, dict):
        return ParseError(f"{where} must hold a JSON object with \"name\" and \"arguments\" "
                          f"(got a {type(obj).__name__})", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParseError(f"{where} has no \"name\" string (got {name!r:.60})", raw)
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            return ParseError(f"{where}: \"arguments\" is a string that is not valid JSON ({err.msg})", raw)
    if not isinstance(args, dict):
        return ParseError(f"{where}: \"arguments\" must be a JSON object (got a {type(args).__name__})", raw)
    return ToolCall(name, args)
