"""Run a function on a module as soon as it has executed, wherever it is first imported from (a `sys.meta_path`
finder). Used to patch megatron.core.jit before any fusion module reads it (rlhf_mcore/__init__.py) and verl's
trainer inside its Ray workers (tools/bench/verl_hooks.py)."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` with the normal path finder and wraps its loader: `patch(module)` runs right after the module's
    code, before the importer sees it."""

    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)
        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, patch: Callable) -> None:
    """`patch(module)` once `name` is imported: now if it already is, else right after its first import."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, AfterImport(name, patch))
