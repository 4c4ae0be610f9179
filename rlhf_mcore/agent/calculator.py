"""The built-in ``calculator`` tool: arithmetic read with `ast`, never `eval`.

Numbers, ``+ - * / // % **``, unary ``-``/``+``, parentheses, and a few functions and constants of `math`.
Anything else (names, attributes, subscripts, strings, ``^``) is refused with a message saying what is
allowed. Integers stay below 2**MAX_INT_BITS and a power is checked before it is computed, so
``9**9**9`` is refused at once instead of running for hours.

>>> calculate("2 + 3 * (4 - 1) ** 2")
'29'
>>> calculate("sqrt(16) / 8")
'0.5'
>>> calculate("9**9**9")
Traceback (most recent call last):
...
ValueError: 9 ** 387420489 is too large (the result may have at most 4096 bits)
"""
from __future__ import annotations

import ast
import math
import operator

from rlhf_mcore.agent.schema import Tool

MAX_INT_BITS = 4096
MAX_EXPRESSION_CHARS = 2000
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log10": math.log10, "log2": math.log2,
              "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos,
              "atan": math.atan, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
              "factorial": math.factorial}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text; ValueError names what was refused."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression must be a string of at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    try:
        return str(_value(tree.body))
    except (ZeroDivisionError, OverflowError) as err:
        raise ValueError(f"{type(err).__name__}: {err}") from None


def _value(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or not 1 <= len(node.args) <= 2:
            raise ValueError(f"{node.func.id}() takes one or two positional numbers")
        args = [_value(a) for a in node.args]
        if node.func.id == "factorial" and not (isinstance(args[0], int) and 0 <= args[0] <= 500):
            raise ValueError("factorial() takes an integer from 0 to 500")
        return _bounded(_FUNCTIONS[node.func.id](*args))
    raise ValueError(_refusal(node))


def _check_power(base, exponent) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log2(abs(base)) >= MAX_INT_BITS:
            raise ValueError(f"{base} ** {exponent} is too large (the result may have at most {MAX_INT_BITS} bits)")


def _bounded(value):
    if isinstance(value, bool):
        raise ValueError("booleans are not numbers here")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"an intermediate integer has more than {MAX_INT_BITS} bits")
    if isinstance(value, complex):
        raise ValueError("the result is a complex number")
    return value


def _refusal(node: ast.AST) -> str:
    allowed = (f"numbers, + - * / // % **, parentheses, {', '.join(_FUNCTIONS)}() and {', '.join(_CONSTANTS)}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return "'^' is not a power here: write ** (e.g. 2**10)"
    if isinstance(node, ast.Name):
        return f"unknown name '{node.id}'. Allowed: {allowed}"
    if isinstance(node, ast.Call):
        return f"only these functions may be called: {', '.join(_FUNCTIONS)}"
    return f"{type(node).__name__} is not allowed. Allowed: {allowed}"


def run_calculator(arguments: dict, context: dict) -> str:
    return calculate(arguments.get("expression", ""))


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression and return its value. Supports numbers, + - * / // % ** "
                "(power), parentheses, sqrt, exp, log, log10, log2, sin, cos, tan, abs, round, floor, ceil, "
                "factorial, pi and e. Example: {\"expression\": \"(17 * 23 + 4) / 3\"}.",
    parameters={"type": "object",
                "properties": {"expression": {"type": "string", "description": "the expression, e.g. 2*(3+4)"}},
                "required": ["expression"]},
    fn=run_calculator, sandboxed=False, origin="rlhf_mcore.agent.calculator:run_calculator",
)
