"""Tool definitions and custom tools files: good files load (decorator and TOOLS list), and every bad file,
schema or signature is a ValueError naming the file and the tool; schemas are what chat templates take."""
from __future__ import annotations

import textwrap

import pytest

from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import TOOLS, Tool, load_tools, tool_schemas

GOOD = '''
from rlhf_mcore.agent.tools import Tool, tool

@tool(name="lookup", description="Look a word up.",
      parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]})
def lookup(arguments, context):
    return {"cat": "a small feline"}.get(arguments["word"], "not found")

@tool(name="answer_key", description="Tell whether a guess is right.", sandboxed=False,
      parameters={"type": "object", "properties": {"guess": {"type": "string"}}, "required": ["guess"]})
def answer_key(arguments, context):
    return {"right": arguments["guess"] == context.get("ground_truth")}

def _shout(arguments, context):
    return arguments["text"].upper()

TOOLS = [Tool("shout", "Upper-case the text.", {"type": "object", "properties": {"text": {"type": "string"}}},
              _shout)]
'''
SCHEMA = '{"type": "object", "properties": {"x": {"type": "string"}}}'


def write(tmp_path, body: str, name: str = "my_tools.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_builtins_and_their_schemas():
    assert TOOLS.names() == ["calc_geo3k_reward", "calc_gsm8k_reward", "calculator", "python"]
    schemas = tool_schemas(load_tools(["python", "calculator"], None).values())
    assert [s["type"] for s in schemas] == ["function", "function"]
    python = schemas[0]["function"]
    assert python["name"] == "python" and "print()" in python["description"]
    assert python["parameters"] == {"type": "object", "required": ["code"],
                                    "properties": {"code": {"type": "string", "description": "the Python code to run"}}}


def test_custom_file_loads_and_runs_in_sandbox_and_in_process(tmp_path):
    path = write(tmp_path, GOOD)
    tools = load_tools([], path)
    assert sorted(tools) == ["answer_key", "lookup", "shout"]
    assert tools["lookup"].sandboxed and not tools["answer_key"].sandboxed
    mixed = load_tools(["calculator", "lookup"], path)
    assert list(mixed) == ["calculator", "lookup"]
    with ToolExecutor(tools, timeout_s=5, max_output_chars=200, memory_mb=512, workers=2) as ex:
        calls = [ToolCall("lookup", {"word": "cat"}), ToolCall("shout", {"text": "hi"}),
                 ToolCall("answer_key", {"guess": "72"}), ToolCall("answer_key", {"guess": "71"})]
        kwargs = {"answer_key": {"ground_truth": "72"}}
        results = ex.run(calls, [kwargs] * 4)
    assert [r.text for r in results] == ["a small feline", "HI", '{"right": true}', '{"right": false}']


def test_context_reaches_a_sandboxed_tool(tmp_path):
    path = write(tmp_path, '''
        from rlhf_mcore.agent.tools import tool
        @tool(name="secret", description="d", parameters={"type": "object", "properties": {}})
        def secret(arguments, context):
            return str(context)
    ''')
    with ToolExecutor(load_tools([], path), timeout_s=5, max_output_chars=200, memory_mb=512, workers=1) as ex:
        with_kwargs, without = ex.run([ToolCall("secret", {})] * 2, [{"secret": {"k": 1}, "other": {"k": 2}}, None])
    assert with_kwargs.text == "{'k': 1}" and without.text == "{}"


@pytest.mark.parametrize("body,message", [
    ("x = 1", "defines no tools"),
    ("raise RuntimeError('boom')", "importing it failed: RuntimeError: boom"),
    ("TOOLS = ['python']", "TOOLS must be a list of Tool objects"),
    (f"from rlhf_mcore.agent.tools import tool\n@tool('a', 'd', {SCHEMA})\ndef a(x, y): return ''\n"
     f"@tool('a', 'd', {SCHEMA})\ndef b(x, y): return ''", "tool name 'a' is defined twice"),
    (f"from rlhf_mcore.agent.tools import tool\n@tool('python', 'd', {SCHEMA})\ndef a(x, y): return ''",
     "tool 'python' has the name of a built-in tool"),
    ("from rlhf_mcore.agent.tools import tool\n@tool('t', 'd', {'type': 'array'})\ndef a(x, y): return ''",
     "tool 't': parameters must be a JSON schema with \"type\": \"object\""),
    ("from rlhf_mcore.agent.tools import tool\n@tool('t', 'd', {'type': 'object', 'properties': {'x': {'type': "
     "'str'}}})\ndef a(x, y): return ''", "tool 't': parameters.properties.x must be a schema with a JSON type"),
    ("from rlhf_mcore.agent.tools import tool\n@tool('t', 'd', {'type': 'object', 'properties': {}, "
     "'required': ['x']})\ndef a(x, y): return ''", "tool 't': parameters.required must list names"),
    (f"from rlhf_mcore.agent.tools import tool\n@tool('t', 'd', {SCHEMA})\ndef a(arguments): return ''",
     "tool 't': fn a(arguments) cannot be called with (arguments, context)"),
    (f"from rlhf_mcore.agent.tools import tool\n@tool('t', '', {SCHEMA})\ndef a(x, y): return ''",
     "tool 't': description must be a non-empty string"),
    (f"from rlhf_mcore.agent.tools import tool\n@tool('my tool', 'd', {SCHEMA})\ndef a(x, y): return ''",
     "tool 'my tool': the name must match"),
])
def test_bad_files_name_the_file_and_the_tool(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ValueError) as err:
        load_tools([], path)
    text = str(err.value)
    assert message in text
    assert path in text


def test_missing_file_and_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="not an existing .py file"):
        load_tools([], str(tmp_path / "nope.py"))
    path = write(tmp_path, GOOD)
    with pytest.raises(ValueError, match=r"unknown tool 'lokup'. Did you mean 'lookup'\? Available \(built-ins"):
        load_tools(["lokup"], path)
    with pytest.raises(ValueError, match="no tools chosen"):
        load_tools([], None)


def test_tool_object_checks_itself():
    with pytest.raises(ValueError, match="fn is a str, not a function"):
        Tool("t", "d", {"type": "object", "properties": {}}, "print")


def test_a_sandboxed_tool_needs_a_function_a_new_process_can_import():
    def local(arguments, context):
        return ""

    schema = {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="must be found by a new process.*test_tools.test_a_sandboxed_tool"):
        Tool("t", "d", schema, local)
    assert not Tool("t", "d", schema, local, sandboxed=False).sandboxed
    assert Tool("t", "d", schema, write).origin == f"{write.__module__}:write"  # module level: found by name
