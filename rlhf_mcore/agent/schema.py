"""A tool: an OpenAI-style function schema (name, description, JSON-schema parameters) and the function.

A tool function is called as ``fn(arguments, context) -> str``: ``arguments`` is the JSON object the model
wrote, ``context`` the sample's kwargs for this tool: verl's ``extra_info.tools_kwargs[tool_name]`` with its
``create_kwargs`` and ``execute_kwargs`` merged by the multi-turn rollout (e.g. ``{"ground_truth": "72"}``),
or ``{}`` when the row has none. A return value that is not
a string is sent to the model as JSON. ``sandboxed=True`` runs the call in a fresh, limited process (see
`sandbox`); ``False`` runs it in a thread of the trainer (for fast, trusted functions).

>>> @tool(name="echo", description="Repeat the text.",
...       parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
... def echo(arguments, context):
...     return arguments["text"]
>>> echo.name, echo.fn({"text": "hi"}, {})
('echo', 'hi')
>>> Tool("bad name", "d", {"type": "object", "properties": {}}, echo.fn)
Traceback (most recent call last):
...
ValueError: tool 'bad name': the name must match [A-Za-z_][A-Za-z0-9_.-]{0,63} (the model writes it in its calls).
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
SIGNATURE_HINT = "def my_tool(arguments: dict, context: dict) -> str"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments: {"type": "object", "properties": {...}, "required": [...]}
    fn: Callable[..., Any]  # fn(arguments: dict, context: dict) -> str
    sandboxed: bool = True
    origin: str = ""  # where a sandbox process finds fn: "module:qualname" or "path/to/tools.py" (set on load)

    def __post_init__(self):
        if not self.origin and callable(self.fn):  # a module-level function is found by its module and name
            object.__setattr__(self, "origin", f"{self.fn.__module__}:{self.fn.__qualname__}")
        problems = check_tool(self)
        if problems:
            raise ValueError(f"tool '{self.name}': " + " ".join(problems))

    def schema(self) -> dict:
        """The OpenAI function entry passed as ``tools=`` to a chat template."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def tool(name: str, description: str, parameters: dict, sandboxed: bool = True) -> Callable[[Callable], Tool]:
    """Decorator for a custom tools file: turns ``fn(arguments, context)`` into a `Tool`."""
    def wrap(fn: Callable) -> Tool:
        return Tool(name, description, parameters, fn, sandboxed, origin=f"{fn.__module__}:{fn.__qualname__}")
    return wrap


def check_tool(t: Tool) -> list[str]:
    """Problems with a tool's name, description, schema or function (empty when it is fine)."""
    if not isinstance(t.name, str) or not _NAME.fullmatch(t.name):
        return [f"the name must match {_NAME.pattern} (the model writes it in its calls)."]
    if not isinstance(t.description, str) or not t.description.strip():
        return ["description must be a non-empty string (the model reads it to decide when to call the tool)."]
    problems = check_parameters(t.parameters)
    if not callable(t.fn):
        problems.append(f"fn is a {type(t.fn).__name__}, not a function. Write {SIGNATURE_HINT}.")
    elif not _accepts_two(t.fn):
        problems.append(f"fn {_signature(t.fn)} cannot be called with (arguments, context). Write {SIGNATURE_HINT}.")
    elif t.sandboxed and not _importable(t.origin):
        problems.append(f"a sandboxed tool's function must be found by a new process: a module-level function of "
                        f"an importable module or of a tools file (got origin {t.origin!r}). Move it to module "
                        "level, or set sandboxed=False to run it in the trainer.")
    return problems


def _importable(origin: str) -> bool:
    if origin.endswith(".py"):
        return True
    module, _, qualname = origin.partition(":")
    return bool(module) and module != "__main__" and bool(qualname) and "<locals>" not in qualname


def check_parameters(params: Any) -> list[str]:
    """A JSON-schema object of OpenAI function parameters: type object, properties a dict of typed schemas,
    required a list of property names."""
    if not isinstance(params, dict) or params.get("type") != "object":
        return [f"parameters must be a JSON schema with \"type\": \"object\" (got {params!r:.80})."]
    props = params.get("properties", {})
    if not isinstance(props, dict):
        return [f"parameters.properties must be an object mapping argument names to schemas (got {props!r:.80})."]
    problems = []
    for key, sub in props.items():
        kind = sub.get("type") if isinstance(sub, dict) else None
        kinds = kind if isinstance(kind, list) else [kind]
        if not isinstance(sub, dict) or not kinds or not all(k in _JSON_TYPES for k in kinds):
            problems.append(f"parameters.properties.{key} must be a schema with a JSON type "
                            f"({', '.join(sorted(_JSON_TYPES))}) (got {sub!r:.80}).")
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        problems.append(f"parameters.required must list names of parameters.properties (got {required!r:.80}).")
    return problems


def _accepts_two(fn: Callable) -> bool:
    try:
        inspect.signature(fn).bind({}, {})
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: trust it
        return True
    return True


def _signature(fn: Callable) -> str:
    try:
        return f"{getattr(fn, '__name__', 'fn')}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return repr(fn)
