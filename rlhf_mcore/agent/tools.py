"""The tool registry: built-in tools by name (``TOOLS``), custom tools from a file, and the schemas the
chat template receives.

Built-ins: ``python`` (code in a sandbox process; `python_tool`, `sandbox`), ``calculator`` (arithmetic via
`ast`; `calculator`), and verl's grading tools ``calc_gsm8k_reward`` and ``calc_geo3k_reward`` (`grading_tools`).
A custom tools file (see `custom`) adds its own.

>>> sorted(load_tools(["calculator"], None))
['calculator']
>>> tool_schemas(load_tools(["calculator"], None).values())[0]["function"]["name"]
'calculator'
>>> load_tools(["pyhton"], None)
Traceback (most recent call last):
...
ValueError: unknown tool 'pyhton'. Did you mean 'python'? Available: calc_geo3k_reward, calc_gsm8k_reward, \
calculator, python.
"""
from __future__ import annotations

from typing import Iterable

from rlhf_mcore.agent.calculator import CALCULATOR
from rlhf_mcore.agent.custom import load_tools_file
from rlhf_mcore.agent.grading_tools import GEO3K_TOOL, GSM8K_TOOL
from rlhf_mcore.agent.python_tool import PYTHON
from rlhf_mcore.agent.schema import Tool, tool
from rlhf_mcore.registry import Registry, suggest

__all__ = ["TOOLS", "Tool", "load_tools", "tool", "tool_schemas"]

TOOLS: Registry[Tool] = Registry("tool")
for _builtin in (PYTHON, CALCULATOR, GSM8K_TOOL, GEO3K_TOOL):
    TOOLS.register(_builtin.name)(_builtin)


def load_tools(names: list[str], tools_file: str | None) -> dict[str, Tool]:
    """name -> Tool for `names`: built-ins, or tools of `tools_file`; every tool of the file when `names`
    is empty. A custom tool may not reuse a built-in's name. ValueError for an unknown name or a bad file."""
    custom = load_tools_file(tools_file) if tools_file else {}
    clash = sorted(set(custom) & set(TOOLS.names()))
    if clash:
        raise ValueError(f"tools file '{tools_file}': tool '{clash[0]}' has the name of a built-in tool. "
                         f"Rename it (built-ins: {', '.join(TOOLS.names())}).")
    chosen: dict[str, Tool] = {}
    for name in list(names) or list(custom):
        if name in custom:
            chosen[name] = custom[name]
        elif name in TOOLS:
            chosen[name] = TOOLS.get(name)
        else:
            known = TOOLS.names() + sorted(custom)
            where = f" (built-ins and those of '{tools_file}')" if tools_file else ""
            raise ValueError(f"unknown tool '{name}'.{suggest(name, known)} Available{where}: {', '.join(known)}.")
    if not chosen:
        raise ValueError("no tools chosen: name built-in tools or give a tools file.")
    return chosen


def tool_schemas(tools: Iterable[Tool]) -> list[dict]:
    """The OpenAI-style ``[{"type": "function", "function": {...}}]`` list for ``apply_chat_template(tools=)``."""
    return [t.schema() for t in tools]
