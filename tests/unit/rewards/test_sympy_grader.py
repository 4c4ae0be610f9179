r"""PRM800K's answer grader (mathruler's ``grade_answer``, which verl's geometry3k reward calls) and the LaTeX-to-text
rendering it relies on (pylatexenc's ``latex2text``).

Expected values are read from those two packages' code; when this was written mathruler 0.1.0 and pylatexenc 2.11
(unpacked into a temporary directory for the check only, never a dependency) agreed with every row below, with
our ``grade_answer`` on all 15,625 pairs of 125 answer forms (integers, decimals, fractions, roots, pi, degrees,
units, tuples, text), and on 99.9% of 30,000 random LaTeX fragments: the rest were malformed LaTeX (an accent such
as ``\hat{``, ``\\[``, a ``\frac`` whose argument is a macro or that ends the text).
"""
import pytest

from rlhf_mcore.rewards.latex_text import latex_to_text
from rlhf_mcore.rewards.sympy_grader import (
    grade_answer,
    normalize_mathd,
    normalize_prm800k,
    split_tuple,
    sympy_equal,
)


@pytest.mark.parametrize("latex, text", [  # pylatexenc 2.11's output for each
    (r"\frac{1}{2}", "1/2"),
    (r" \frac{a+b}{c}", " a+b/c"),  # no parentheses
    (r"\frac12", "1/2"),
    (r"\frac {1} {2}", "1/2"),
    (r"\frac\pi2", "π/2"),
    (r"\frac}", "/"),  # arguments cut short by a brace are empty
    (r"\frac{1}{", "1/"),
    (r"2\sqrt{3}", "2√(3)"),
    (r"\sqrt3", "√(3)"),
    (r"\sqrt 32", "√(3)2"),
    (r"\sqrt[3]{8}x", "√(8)x"),  # the index is dropped
    (r"\sqrt{\sqrt{2}}", "√(√(2))"),
    (r"\sqrt{3", "√(3)"),  # an unclosed group runs to the end
    (r"3\pi", "3π"),
    (r"\pi  r", "πr"),  # spaces after a macro name are consumed
    ("\\pi\nr", "πr"),  # ... with one line break
    ("\\pi\n\nr", "π\n\nr"),  # ... but not a blank line
    (r"\textbf{a}  b", "a  b"),  # spaces after a group stay
    (r"2 \times 3", "2 ×3"),
    (r"\alpha\beta \Delta ABC", "αβΔABC"),
    (r"\phi \varphi \epsilon \varepsilon", "ϕφϵε"),
    (r"m\angle 1 = 45^\circ", "m∠1 = 45^∘"),
    (r"\left(1,2\right)", "(1,2)"),
    (r"\left\{1\right\}", "{1}"),
    (r"\text{cm} \mathrm{m}^2", "cm m^2"),
    (r"\unknownmacro{5}", "5"),
    (r"\degree \triangle \ne", ""),  # macros pylatexenc does not know are dropped
    (r"\tan 30 \sin x", "tan30 sinx"),
    (r"x\ y\,z\;w\!v", "x y z wv"),
    (r"\quad|\qquad", "  |    "),
    (r"\% \$ \{ \} \_ \& \#", "% $ { } _ & #"),
    ("5 ~ 6 & 7 \\\\ 8", "5 \xa0 6     7 \n 8"),
    (r"5}", "5"),
])
def test_latex_to_text_as_pylatexenc(latex, text):
    assert latex_to_text(latex) == text


@pytest.mark.parametrize("latex", [r"\sqrt", r"3\frac", r"\frac{1}"])
def test_an_argument_past_the_end_raises(latex):
    # pylatexenc raises for \sqrt and prints its template "%s/%s" for \frac; the grader keeps the LaTeX instead
    with pytest.raises(ValueError):
        latex_to_text(latex)


@pytest.mark.parametrize("raw, normal", [  # Hendrycks' strip_string
    (r"\text{ 5 }", "5"),
    (r"\left(\dfrac{1}{2}, 3\right)", r"(\frac{1}{2},3)"),
    (r"45^{\circ}", "45"),
    (r"\$5", "5"),
    (r"5 \text{ cm}", "5"),
    (r"5 \text{ cm} and 6 \text{ cm}", r"5 \text{ cm} and 6 \text{ cm}"),  # two units: left as it was
    (r"50\%", "50"),
    (".5", r"\frac{1}{2}"),
    ("k = 7", "7"),
    ("abc = 7", "abc=7"),  # a left side of three characters stays
    (r"\sqrt2+\sqrt{3}", r"\sqrt{2}+\sqrt{3}"),
    (r"\frac12 + \frac1{3}", r"\frac{1}{2}+\frac{1}{3}"),
    (r"\frac1", r"\frac1"),  # too short to fix: unchanged
    ("3/4", r"\frac{3}{4}"),
    ("3/4/5", "3/4/5"),
    ("x/4", "x/4"),
    (r"2\sqrt", r"2\sqrt"),  # nothing after \sqrt: left as it was
])
def test_normalize_mathd(raw, normal):
    assert normalize_mathd(raw) == normal


@pytest.mark.parametrize("raw, normal", [  # PRM800K's _normalize
    (r"\text{Yes}", "yes"),
    (r"\$1,000", "1000"),
    ("3 million", "3*10^6"),
    ("2 or 3", "2,3"),
    ("7 3/4", "7+3/4"),
    ("- 5", "-5"),
    ("12 feet", "12"),
    ("5 cm^2", "5"),
    (r"30^ \circ", "30"),
    (r"\frac{\sqrt{3}}{2}", "sqrt(3)/2"),
    (r"2\pi \cdot r", "2pi*r"),
    (r"\{3\}", "3"),
    ("1e3", "1000"),
    ("2.9999999999", "3"),  # a number within 1e-7 of an integer is that integer
    ("1,000.99999999999", "1000"),  # ... truncated, not rounded, once its commas are gone (PRM800K's order)
    ("inf", "inf"),
])
def test_normalize_prm800k(raw, normal):
    assert normalize_prm800k(raw) == normal


def test_split_tuple_and_sympy():
    assert split_tuple("(1,2)") == ["1", "2"] and split_tuple("(1,(2))") == ["(1,(2))"]
    assert split_tuple("1,000") == ["1000"] and split_tuple("") == []
    assert sympy_equal("pi/3", "2pi/6") and not sympy_equal("1/3", "0.3333")
    assert not sympy_equal("abc", "abc")  # more than two distinct letters: sympy is not asked
    assert not sympy_equal("2^{10}", "1024") and not sympy_equal("2^10", "1024")  # exponents it refuses


@pytest.mark.parametrize("given, truth, right", [
    ("(1, 2)", r"\left(1,2\right)", True),
    ("[1, 2]", "(1, 2)", False),  # an interval's brackets must match
    ("(2, 1)", "(1, 2)", False),
    ("(1, 0.5)", r"(1, \frac{1}{2})", True),  # element by element
    ("(1, 2, 3)", "(1, 2)", False),
    ("A", r"\text{(A)}", True),  # "(a)" is a tuple of one element: "a"
    ("a", "A", True),  # text answers ignore case
    ("x+1", "1+x", True),
    ("2x", "x*2", True),
    ("0.333", r"\frac{1}{3}", False),
    ("1024", "2^{10}", False),
    (r"\frac{\pi}{3}", "60", False),
    ("", "0", False),
    (None, "0", False),
])
def test_grade_answer(given, truth, right):
    assert grade_answer(given, truth) is right
