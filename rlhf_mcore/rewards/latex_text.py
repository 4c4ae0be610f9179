r"""LaTeX math answers to plain text, as pylatexenc's ``latex2text`` renders them for the PRM800K grader.

The grader (``sympy_grader``) turns a LaTeX answer into text that sympy can parse. It uses pylatexenc's renderer,
whose rules we follow for the part of LaTeX that math answers use:
- ``\frac{a}{b}`` is ``a/b`` with no parentheses (so ``\frac{1+x}{2}`` reads as ``1+x/2``: the renderer's rule);
- ``\sqrt[n]{x}`` is ``√(x)``; the index is dropped;
- symbol macros become their Unicode character (Greek letters, relations, ``\cdot`` ``·``, ``\pi`` ``π``), and
  function names their name (``\sin`` ``sin``);
- spacing macros become spaces, ``\!`` nothing, escaped characters themselves, ``~`` a no-break space;
- every other macro is dropped, and its braced arguments are kept as plain groups (``\text{cm}`` ``cm``);
- braces are dropped; the spaces (and one line break) after a macro name are consumed.
An argument cut short by a closing brace is empty (``\frac}`` is ``/``); a ``\frac`` or ``\sqrt`` that the text
ends before its argument raises ValueError, and the grader then keeps the LaTeX as it is.

Not rendered as pylatexenc does: accents (``\hat{x}``, ``\vec{v}``) and math fonts (``\mathbf{x}``), whose
letters it decorates with Unicode marks; here they are plain letters.

>>> latex_to_text(r"2\sqrt{3} + \frac{\pi}{2}")
'2√(3) + π/2'
>>> latex_to_text(r"\left( 1, \frac12 \right) \text{ cm}")
'( 1, 1/2 )  cm'
"""
from __future__ import annotations

_GREEK = ("alpha beta gamma delta zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon chi psi "
          "omega").split()
_GREEK_SMALL, _GREEK_CAPITAL = "αβγδζηθικλμνξοπρστυχψω", "ΑΒΓΔΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΧΨΩ"
_GREEK_VARIANTS = {"epsilon": "ϵ", "varepsilon": "ε", "Epsilon": "Ε", "phi": "ϕ", "varphi": "φ", "Phi": "Φ",
                   "vartheta": "ϑ", "varpi": "ϖ", "varrho": "ϱ", "varsigma": "ς", "varkappa": "ϰ"}
_MATH_SYMBOLS = {
    "circ": "∘", "angle": "∠", "measuredangle": "∡", "rightangle": "∟", "bigtriangleup": "△", "square": "□",
    "cong": "≅", "sim": "∼", "simeq": "≃", "approx": "≈", "neq": "≠", "equiv": "≡", "le": "≤", "leq": "≤", "ge": "≥",
    "geq": "≥", "pm": "±", "mp": "∓", "cdot": "·", "times": "×", "div": "÷", "perp": "⊥", "parallel": "∥",
    "infty": "∞", "cup": "∪", "cap": "∩", "in": "∈", "notin": "∉", "subset": "⊂", "subseteq": "⊆", "emptyset": "∅",
    "varnothing": "∅", "therefore": "∴", "because": "∵", "ldots": "…", "dots": "…", "cdots": "⋯", "prime": "'",
    "to": "→", "rightarrow": "→", "Rightarrow": "⇒", "mid": "|", "vert": "|", "lfloor": "⌊", "rfloor": "⌋",
    "lceil": "⌈", "rceil": "⌉", "langle": "⟨", "rangle": "⟩", "lbrace": "{", "rbrace": "}", "surd": "√",
    "textdegree": "°", "partial": "∂", "nabla": "∇", "sum": "∑", "prod": "∏", "int": "∫", "star": "⋆",
}
_FUNCTIONS = ("sin cos tan arcsin arccos arctan sinh cosh tanh arcsinh arccosh arctanh ln log exp max min sup inf "
              "lim").split()
_SPACES = {"quad": "  ", "qquad": "    "}
_ONE_CHAR = {",": " ", ";": " ", ":": " ", " ": " ", "\\": "\n", "{": "{", "}": "}", "$": "$", "%": "%", "&": "&",
             "#": "#", "_": "_"}  # \<char>; any other is dropped
_SPECIALS = {"~": "\xa0", "&": "   "}
_FRACTIONS = ("frac", "nicefrac", "textfrac")


SYMBOLS: dict[str, str] = {
    **dict(zip(_GREEK, _GREEK_SMALL)), **dict(zip((g.capitalize() for g in _GREEK), _GREEK_CAPITAL)),
    **_GREEK_VARIANTS, **_MATH_SYMBOLS, **{f: f for f in _FUNCTIONS}, **_SPACES,
}


def latex_to_text(latex: str) -> str:
    """The plain-text rendering of ``latex`` (see the module doc for the rules)."""
    text, _ = _render(latex, 0, stop_at_brace=False)
    return text


def _render(s: str, i: int, stop_at_brace: bool) -> tuple[str, int]:
    """Render from ``s[i]`` to the end (or, inside a group, to its closing brace); return (text, next index)."""
    out = []
    while i < len(s):
        ch = s[i]
        if ch == "}":
            if stop_at_brace:
                return "".join(out), i + 1
            i += 1  # an unmatched closing brace is dropped
        elif ch == "{":
            text, i = _render(s, i + 1, stop_at_brace=True)  # an unclosed group runs to the end
            out.append(text)
        elif ch == "\\":
            text, i = _macro(s, i + 1)
            out.append(text)
        else:
            out.append(_SPECIALS.get(ch, ch))
            i += 1
    return "".join(out), i


def _macro(s: str, i: int) -> tuple[str, int]:
    """Render the macro whose name starts at ``s[i]`` (just after its backslash), with its arguments."""
    if i >= len(s):
        return "", i
    if not s[i].isalpha():
        return _ONE_CHAR.get(s[i], ""), i + 1
    end = i
    while end < len(s) and s[end].isalpha():
        end += 1
    name, i = s[i:end], _skip_spaces(s, end)
    if name in _FRACTIONS:
        num, i = _argument(s, i, name)
        den, i = _argument(s, i, name)
        return f"{num}/{den}", i
    if name == "sqrt":
        i = _skip_optional(s, i)
        radicand, i = _argument(s, i, name)
        return f"√({radicand})", i
    return SYMBOLS.get(name, ""), i


def _argument(s: str, i: int, name: str) -> tuple[str, int]:
    """One argument: a braced group, a macro, or a single character."""
    i = _skip_spaces(s, i)
    if i >= len(s):
        raise ValueError(f"\\{name} is missing an argument")
    if s[i] == "}":
        return "", i  # an empty argument; the brace closes what encloses the macro
    if s[i] == "{":
        return _render(s, i + 1, stop_at_brace=True)
    if s[i] == "\\":
        return _macro(s, i + 1)
    return _SPECIALS.get(s[i], s[i]), i + 1


def _skip_optional(s: str, i: int) -> int:
    """Past an optional ``[...]`` argument, if one follows."""
    j = _skip_spaces(s, i)
    if j < len(s) and s[j] == "[":
        close = s.find("]", j)
        return len(s) if close < 0 else close + 1
    return i


def _skip_spaces(s: str, i: int) -> int:
    """Past the spaces after a macro name, one line break among them; a blank line (a paragraph) stays."""
    j = i
    while j < len(s) and s[j] in " \t\n":
        j += 1
    return i if s.count("\n", i, j) > 1 else j
