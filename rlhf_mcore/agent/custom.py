"""Custom tools from a user's Python file (``rollout.multi_turn.tools_file``).

The file defines its tools with the `tool` decorator (or builds `Tool` objects and lists them in a
module-level ``TOOLS``); every `Tool` at module level counts::

    from rlhf_mcore.agent.tools import tool

    @tool(name="lookup", description="Look up a word in the course glossary.",
          parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]})
    def lookup(arguments: dict, context: dict) -> str:
        return GLOSSARY.get(arguments["word"], "not found")

Loading imports the file and checks every tool (name, description, JSON schema, signature) and that names
are unique; each problem is a ValueError naming the file and the tool.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from rlhf_mcore.agent.schema import Tool

_loaded: dict[str, dict[str, Tool]] = {}


def load_tools_file(path: str) -> dict[str, Tool]:
    """name -> Tool for every tool the file defines (loaded once per process, by resolved path)."""
    file = Path(path)
    if not file.is_file() or file.suffix != ".py":
        raise ValueError(f"tools file '{path}': not an existing .py file. Give the path of a Python file that "
                         "defines tools with @tool(...) (rlhf_mcore.agent.tools.tool).")
    key = str(file.resolve())
    if key not in _loaded:
        _loaded[key] = _collect(_import(file, key), file)
    return _loaded[key]


def _import(file: Path, key: str):
    name = f"rlhf_mcore_custom_tools_{file.stem}_{abs(hash(key))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"tools file '{file}': cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ValueError(f"tools file '{file}': importing it failed: {type(err).__name__}: {err}") from err
    return module


def _collect(module, file: Path) -> dict[str, Tool]:
    listed = getattr(module, "TOOLS", [])
    if not isinstance(listed, (list, tuple)) or not all(isinstance(t, Tool) for t in listed):
        raise ValueError(f"tools file '{file}': TOOLS must be a list of Tool objects (got {listed!r:.80}).")
    found = list(listed) + [v for v in vars(module).values() if isinstance(v, Tool) and v not in listed]
    if not found:
        raise ValueError(f"tools file '{file}': defines no tools. Decorate a function "
                         "`def my_tool(arguments: dict, context: dict) -> str` with "
                         "@tool(name=..., description=..., parameters=...).")
    tools: dict[str, Tool] = {}
    for t in found:
        if t.name in tools and tools[t.name] is not t:
            raise ValueError(f"tools file '{file}': tool name '{t.name}' is defined twice. Give each tool its "
                             "own name.")
        tools[t.name] = Tool(t.name, t.description, t.parameters, t.fn, t.sandboxed, origin=str(file.resolve()))
    return tools
