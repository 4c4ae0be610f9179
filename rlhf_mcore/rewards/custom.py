"""Load a user reward function from ``path/to/file.py:function_name`` (verl's ``custom_reward_function``).

The function must accept verl's four positional arguments ``(data_source, solution_str, ground_truth,
extra_info)`` and return a float or a dict with ``"score"``. Every problem is reported as a ValueError that
names the file and says how to fix it, at load time rather than inside the training loop.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

_SPEC_FORM = "'path/to/file.py:function_name'"


def parse_reward_spec(spec: str) -> tuple[Path, str]:
    """Split ``"file.py:fn"`` into ``(Path("file.py"), "fn")``; raise ValueError on another form.

    >>> parse_reward_spec("rewards/my.py:score")
    (PosixPath('rewards/my.py'), 'score')
    """
    path, sep, name = str(spec).rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise ValueError(f"custom reward: expected {_SPEC_FORM} (got {spec!r}).")
    return Path(path), name


def load_custom_reward(spec: str) -> Callable:
    """Import the file and return its function (a `rewards.dispatch.RewardFn`), checked to be callable with
    verl's four arguments."""
    path, name = parse_reward_spec(spec)
    if not path.is_file():
        raise ValueError(f"custom reward: file '{path}' does not exist. Give {_SPEC_FORM} of a real file.")
    module_name = f"rlhf_mcore_custom_reward_{path.stem}_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"custom reward: cannot import '{path}' as a Python module (is it a .py file?).")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # lets pickle and dataclasses find the module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise ValueError(f"custom reward: importing '{path}' failed: {type(err).__name__}: {err}") from err
    if not hasattr(module, name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"custom reward: '{path}' has no function '{name}'. Callables defined there: {public or 'none'}."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise ValueError(f"custom reward: '{path}:{name}' is a {type(fn).__name__}, not a function.")
    _check_signature(fn, f"{path}:{name}")
    return fn


def _check_signature(fn, where: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        signature.bind("data_source", "solution", "ground_truth", {})
    except TypeError as err:
        raise ValueError(
            f"custom reward: {where} must accept (data_source, solution_str, ground_truth, extra_info) "
            f"(got signature {signature}: {err})."
        ) from err
