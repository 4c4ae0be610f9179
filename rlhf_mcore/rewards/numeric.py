r"""Exact numeric reading of answer strings, shared by the GSM8K and MATH rewards.

Numbers become ``fractions.Fraction`` so that ``0.5``, ``1/2`` and ``\frac{1}{2}`` compare equal exactly,
without float tolerance (``0.333`` and ``1/3`` stay different, as they should).

>>> parse_number("1,234.50")
Fraction(2469, 2)
>>> parse_number("-\\frac{3}{4}") == parse_number("-0.75") == parse_number("-3/4")
True
>>> parse_number("x+1") is None
True
"""
from __future__ import annotations

import re
from fractions import Fraction

_DECIMAL = r"\d+(?:\.\d*)?|\.\d+"
_DECIMAL_RE = re.compile(rf"[+-]?(?:{_DECIMAL})(?:[eE][+-]?\d{{1,2}})?")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SLASH_RE = re.compile(rf"([+-]?(?:{_DECIMAL}))/([+-]?(?:{_DECIMAL}))")
_FRAC_RE = re.compile(rf"([+-]?)\\[dt]?frac\{{([+-]?(?:{_DECIMAL}))\}}\{{([+-]?(?:{_DECIMAL}))\}}")
_MAX_CHARS = 64  # longer strings are not plain numbers; also bounds Fraction's work on huge exponents


def strip_thousands(s: str) -> str:
    """Drop thousands separators when ``s`` is a number written with them: ``1,000`` -> ``1000``.

    Commas that are not thousands separators (``(1,2)``, ``1,2,3``) are left alone.
    """
    return s.replace(",", "") if _THOUSANDS_RE.match(s) else s


def parse_number(s: str) -> Fraction | None:
    r"""The exact value of ``s`` when it is a plain number, ``a/b`` or ``\frac{a}{b}``; else None."""
    s = strip_thousands(s.strip())
    if not s or len(s) > _MAX_CHARS:
        return None
    try:
        if _DECIMAL_RE.fullmatch(s):
            return Fraction(s)
        m = _SLASH_RE.fullmatch(s)
        if m:
            return _ratio(m.group(1), m.group(2))
        m = _FRAC_RE.fullmatch(s)
        if m:
            value = _ratio(m.group(2), m.group(3))
            return None if value is None else (-value if m.group(1) == "-" else value)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def _ratio(num: str, den: str) -> Fraction | None:
    d = Fraction(den)
    return None if d == 0 else Fraction(num) / d


def numbers_equal(a: str, b: str) -> bool:
    """True when both strings are numbers (in any of the forms above) of the same exact value."""
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and x == y
