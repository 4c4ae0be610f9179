"""The built-in ``python`` tool: runs the model's code in a sandbox process (`sandbox`) and returns what it
printed. ``print()`` is the interface: the value of the last expression is not shown.

>>> PYTHON.sandboxed, PYTHON.parameters["required"]
(True, ['code'])
"""
from __future__ import annotations

from rlhf_mcore.agent.schema import Tool


def run_python(arguments: dict, context: dict) -> str:
    """Execute ``arguments["code"]`` as a script in this (sandbox) process; its output is the result."""
    code = arguments.get("code")
    if not isinstance(code, str):
        raise ValueError(f"the python tool needs a string argument 'code' (got {type(code).__name__})")
    exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    return ""


PYTHON = Tool(
    name="python",
    description="Run Python 3 code in a fresh sandboxed interpreter and return what it prints (stdout and "
                "stderr). Use print() to show results: the value of the last expression is not returned. "
                "Limits: a time-out, a memory limit, no network, no subprocesses, files only in its own "
                "temporary directory; output is cut to a maximum length. The standard library is available.",
    parameters={"type": "object",
                "properties": {"code": {"type": "string", "description": "the Python code to run"}},
                "required": ["code"]},
    fn=run_python, sandboxed=True, origin="rlhf_mcore.agent.python_tool:run_python",
)
