"""The hermes tool-call parser on what Qwen2.5/Qwen3 templates emit: one call, several, string arguments,
and each kind of malformed block (a ParseError naming the fault, the other blocks still parsed)."""
from __future__ import annotations

import pytest

from rlhf_mcore.agent.parsers import TOOL_CALL_PARSERS, ParseError, ToolCall, parse


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_one_call_as_qwen_writes_it():
    text = 'Let me compute.\n' + block('{"name": "python", "arguments": {"code": "print(2 ** 10)\\nx = \\"a\\""}}')
    assert parse(text) == [ToolCall("python", {"code": 'print(2 ** 10)\nx = "a"'})]


def test_several_calls_in_order_and_text_around_them():
    text = ("I will call two tools.\n" + block('{"name": "calculator", "arguments": {"expression": "1+1"}}') + "\n"
            + block('{"name": "python", "arguments": {"code": "print(3)"}}') + "\nDone.")
    assert parse(text) == [ToolCall("calculator", {"expression": "1+1"}), ToolCall("python", {"code": "print(3)"})]


def test_arguments_as_a_json_string_or_missing():
    text = block('{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}') + block('{"name": "now"}')
    assert parse(text) == [ToolCall("python", {"code": "print(1)"}), ToolCall("now", {})]


def test_no_call_is_an_empty_list():
    assert parse("The answer is 42. <tool_response> is not a call") == []


@pytest.mark.parametrize("body,fault", [
    ('{"name": "python", "arguments": {"code": "x"}', "not valid JSON"),
    ('["python", {"code": "x"}]', "must hold a JSON object"),
    ('{"arguments": {"code": "x"}}', 'no "name" string'),
    ('{"name": 3, "arguments": {}}', 'no "name" string'),
    ('{"name": "python", "arguments": [1, 2]}', '"arguments" must be a JSON object (got a list)'),
    ('{"name": "python", "arguments": "{code: x}"}', '"arguments" is a string that is not valid JSON'),
])
def test_malformed_block_names_the_fault_and_others_still_parse(body, fault):
    good = block('{"name": "calculator", "arguments": {"expression": "2*3"}}')
    first, second = parse(block(body) + good)
    assert isinstance(first, ParseError) and fault in first.message and body in first.raw
    assert second == ToolCall("calculator", {"expression": "2*3"})


def test_unclosed_block():
    (err,) = parse('ok <tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}')
    assert isinstance(err, ParseError) and "not closed" in err.message


def test_registry_lists_formats():
    assert "hermes" in TOOL_CALL_PARSERS
    with pytest.raises(ValueError, match="unknown tool-call parser 'hermez'. Did you mean 'hermes'"):
        parse("x", "hermez")
