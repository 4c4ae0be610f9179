"""Rollout: generation engines, sampling and stop criteria.

Every module of this package is imported here, so each engine registers itself in `base.ROLLOUT_ENGINES`
(`@ROLLOUT_ENGINES.register(name, section=...)`) once anything in `rlhf_mcore.rollout` is imported: a new
engine is one new module (plus its `rollout.<section>` options in `config.py`), with no list to extend.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
