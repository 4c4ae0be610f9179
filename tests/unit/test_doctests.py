"""Every docstring example in the package is executed (pure functions document themselves by example)."""
import doctest
import importlib
import pkgutil

import pytest

import rlhf_mcore

MODULES = sorted(m.name for m in pkgutil.walk_packages(rlhf_mcore.__path__, "rlhf_mcore."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} failing docstring example(s) in {name}"
