"""Every reward module's doctests run as part of the test suite."""
import doctest
import importlib
import pkgutil

import pytest

import rlhf_mcore.rewards as rewards

MODULES = sorted(m.name for m in pkgutil.iter_modules(rewards.__path__, "rlhf_mcore.rewards."))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_every_registered_reward_has_a_doctest():
    for data_source in rewards.REWARDS:
        fn = rewards.get_reward_fn(data_source)
        assert ">>> " in (fn.__doc__ or ""), f"reward {data_source} ({fn.__name__}) has no doctest"
