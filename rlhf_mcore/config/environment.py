"""What the config needs installed, checked with the config rules (the packages are looked up, never imported):
the package of each `trainer.logger` sink and the modules the chosen `rollout.engine` declared at registration
(`@ROLLOUT_ENGINES.register(name, requires=(...))`)."""
from __future__ import annotations

import importlib.util

LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # trainer.logger sink -> the package it needs


def importable(module: str) -> bool:
    """Whether `module` can be found on sys.path (without importing it).

    >>> importable("json"), importable("no_such_package_xyz")
    (True, False)
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def logger_errors(sinks: list[str]) -> list[str]:
    return [f"trainer.logger: {sink} needs the {package} package, which is not installed (got {sinks}). Run "
            f"`pip install {package}`, or drop {sink} from trainer.logger."
            for sink, package in LOGGER_PACKAGES.items() if sink in sinks and not importable(package)]


def engine_errors(engine: str) -> list[str]:
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    if engine not in ROLLOUT_ENGINES:  # an unknown name is reported by the registry rules
        return []
    return [f"rollout.engine: {engine} needs the {module} package, which is not importable (got {engine}). Install "
            "the gpu extra (pip install 'rlhf-mcore[gpu]'), or use rollout.engine=native."
            for module in ROLLOUT_ENGINES.traits(engine).requires if not importable(module)]


def environment_errors(cfg) -> list[str]:
    """One line per package the config names that this Python cannot import."""
    return logger_errors(cfg.trainer.logger) + engine_errors(cfg.rollout.engine)
