r"""PRM800K's answer grader, as the ``mathruler`` package ships it and verl's geometry3k reward calls it.

``grade_answer(given, truth)`` is True when either
1. the two answers are equal after the MATH dataset's string normalisation (``normalize_mathd``: ``\left``,
   ``^\circ``, ``\text{ unit}``, ``k =`` dropped, ``\dfrac`` and ``a/b`` written ``\frac{a}{b}``, ``0.5`` as
   ``\frac{1}{2}``), or
2. they are equal after PRM800K's normalisation (``normalize_prm800k``: unit words and ``$``/``%`` dropped, LaTeX
   rendered as text, lower case, integers in one form), or, element by element for tuples and intervals, sympy
   simplifies their difference to 0. Two rules keep step 2 strict: fractions ``a/b`` must match as written
   (``2/4`` is not ``1/2``), and an integer never equals a non-integer expression.

Sympy only sees expressions with at most two distinct letters and no ``^{``/``^(``/long exponents (the
grader's guard against slow or hostile input); it is imported on first use.

>>> grade_answer(r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}"), grade_answer("0.25", r"\frac14")
(True, True)
>>> grade_answer("2/4", "1/2"), grade_answer("60", r"60^{\circ}"), grade_answer(r"2\sqrt{3}", r"\sqrt{12}")
(False, True, True)
"""
from __future__ import annotations

import re

from rlhf_mcore.rewards.latex_text import latex_to_text

_TEXT_RE = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard")
_UNIT_RES = tuple(re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS)
_WORDS = ((" or ", " , "), (" and ", " , "), ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_TEXT_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
_THOUSANDS_RE = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER_RE = re.compile("([0-9]) +([0-9])")
_FRACTION_RE = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_SLOW_SUBSTRINGS = ("^{", "^(")
_SLOW_RES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"


# --- step 1: the MATH dataset's normalisation -------------------------------------------------------------------

def normalize_mathd(answer: str) -> str:
    r"""The MATH dataset's normal form (Hendrycks' ``strip_string``); a string it cannot parse comes back stripped.

    >>> normalize_mathd(r"x = \dfrac{1}{2}"), normalize_mathd(r"\left( 3, 45^\circ \right)"), normalize_mathd("6/8")
    ('\\frac{1}{2}', '(3,45)', '\\frac{6}{8}')
    >>> normalize_mathd(r"5 \text{ cm}"), normalize_mathd(r"\sqrt2"), normalize_mathd(".5")
    ('5', '\\sqrt{2}', '\\frac{1}{2}')
    """
    answer = answer.strip()
    m = _TEXT_RE.search(answer)
    if m is not None:
        answer = m.group("text").strip()
    try:
        return _strip_mathd(answer)
    except (ValueError, IndexError):  # two units; a \sqrt or \frac with nothing after it
        return answer


def _strip_mathd(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # a unit after the value: keep the value (two units cannot be told apart: give up)
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit")
        s = parts[0]
    s = s.replace("\\%", "").replace("%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _brace_sqrt(s).replace(" ", "")
    s = _brace_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def _brace_sqrt(s: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}`` (one character); an empty ``\sqrt`` at the end raises IndexError."""
    head, *roots = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (r if r[0] == "{" else "{" + r[0] + "}" + r[1:]) for r in roots)


def _brace_fracs(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``; the string unchanged if one is too short."""
    head, *fracs = s.split("\\frac")
    out = [head]
    for f in fracs:
        if f[0] == "{":
            out.append(f)
        elif len(f) < 2:
            return s
        elif f[1] == "{":
            out.append("{" + f[0] + "}" + f[1:])
        else:
            out.append("{" + f[0] + "}{" + f[1] + "}" + f[2:])
    return "\\frac".join(out)


def _slash_to_frac(s: str) -> str:
    """``a/b`` of two integers written plainly -> ``\\frac{a}{b}``."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


# --- step 2: PRM800K's normalisation and sympy -------------------------------------------------------------------

def normalize_prm800k(expr: str) -> str:
    r"""PRM800K's normal form: units, ``$`` and ``%`` dropped, LaTeX as text, no spaces or braces, lower case.

    >>> normalize_prm800k(r"\frac{5\sqrt{2}}{2} \text{ cm}"), normalize_prm800k("7 3/4"), normalize_prm800k("1,000.0")
    ('5sqrt(2)/2', '7+3/4', '1000')
    """
    m = _TEXT_RE.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    for old, new in _WORDS:
        expr = expr.replace(old, new)
    for unit in _UNIT_RES:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _near_int(float(expr)):
        expr = str(round(float(expr)))
    if "\\" in expr:
        expr = _render_latex(expr)
    expr = _MIXED_NUMBER_RE.sub(r"\1+\2", re.sub("- *", "-", expr))
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    return str(int(float(expr.replace(",", "")))) if _str_is_int(expr) else expr


def _render_latex(expr: str) -> str:
    """LaTeX as text, with the symbols sympy reads spelt out (``√`` ``sqrt``, ``π`` ``pi``, ``·`` ``*``)."""
    fracs = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    try:
        text = latex_to_text(fracs)  # " \frac": a mixed number 3\frac12 reads 3 1/2, then 3+1/2
    except ValueError:  # a \frac or \sqrt without its argument: left as it was
        return expr
    for symbol, name in _TEXT_SYMBOLS:
        text = text.replace(symbol, name)
    return text.strip()


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _near_int(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _strip_thousands(expr: str) -> str:
    """Drop commas that separate thousands (``1,000``) and keep tuple commas (``(1,2)``)."""
    while True:
        stripped = _THOUSANDS_RE.sub(r"\1\3\4", expr)
        if stripped == expr:
            return stripped
        expr = stripped


def _str_is_int(s: str) -> bool:
    s = _strip_thousands(s)
    return _is_float(s) and _near_int(float(s))


def _allow_sympy(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    return (len(letters) <= 2 and not any(bad in expr for bad in _SLOW_SUBSTRINGS)
            and not any(bad.search(expr) for bad in _SLOW_RES))


def sympy_equal(truth: str, given: str) -> bool:
    """True when sympy simplifies ``(truth) - (given)`` to 0 (a parse error, or a refused expression: False).

    >>> sympy_equal("sqrt(12)", "2sqrt(3)"), sympy_equal("1/3", "0.333")
    (True, False)
    """
    expr = f"({truth})-({given})"
    if not _allow_sympy(expr):
        return False
    import sympy  # here, not at the top: 0.3 s of import that only this reward pays (torch installs sympy)
    from sympy.parsing import sympy_parser

    steps = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        return bool(sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=steps)) == 0)
    except Exception:  # sympy raises many kinds (SyntaxError, TypeError, TokenError, ...): not equal
        return False


def split_tuple(expr: str) -> list[str]:
    """The elements of ``(a,b)`` / ``[a,b)``-style tuples and intervals; anything else is one element.

    >>> split_tuple("(1,2)"), split_tuple("[1,1,000]"), split_tuple("((1,2))")
    (['1', '2'], ['1', '1000'], ['((1,2))'])
    """
    expr = _strip_thousands(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS and not any(c in inner for c in _BRACKETS):
        return [e.strip() for e in inner.split(",")]
    return [expr]


def _elements_equal(truth: str, given: str) -> bool:
    if _FRACTION_RE.search(truth) and _FRACTION_RE.search(given):
        return truth == given  # unreduced fractions are not accepted
    if _str_is_int(truth) != _str_is_int(given):
        return False  # an integer answer must match as written
    return sympy_equal(truth, given)


def grade_answer(given: str | None, truth: str) -> bool:
    """True when ``given`` is the same answer as ``truth`` (see the module doc)."""
    if given is None:
        return False
    if normalize_mathd(truth) == normalize_mathd(given):
        return True
    truth_n, given_n = normalize_prm800k(truth), normalize_prm800k(given)
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_elems, given_elems = split_tuple(truth_n), split_tuple(given_n)
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # an open interval is not a closed one
    if len(truth_elems) != len(given_elems):
        return False
    return all(_elements_equal(t, g) for t, g in zip(truth_elems, given_elems))
