"""The output directory at start-up (rank 0, under the run lock, before any model): refuse to start over in a
used directory unless asked to (`trainer.resume=restart` moves the earlier run aside), and write config.yaml,
keeping the previous one and naming what changed."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from rlhf_mcore.checkpoint.run_identity import disable_refused, move_aside, used_by

log = logging.getLogger("rlhf_mcore")
CONFIG_FILE = "config.yaml"
IGNORED_CHANGES = ("trainer.resume",)  # differs between a start and its resumes by design
MAX_CHANGES_SHOWN = 20


def claim_run_dir(trainer_cfg) -> list[str]:
    """The problems that stop a start (one line each); `restart` moves the earlier run's files aside."""
    out, resume = Path(trainer_cfg.output_dir), str(trainer_cfg.resume)
    if resume == "disable":
        used = used_by(out)
        return [disable_refused(out, used)] if used else []
    if resume == "restart":
        move_aside(out)
    return []


def _flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"))
    return flat


def config_changes(old_text: str, new_text: str) -> list[str]:
    """`dotted.key: old -> new` for every key whose value differs (added and removed keys too).

    >>> config_changes("trainer:\\n  seed: 1\\n  resume: auto\\n", "trainer:\\n  seed: 2\\n  resume: disable\\n")
    ['trainer.seed: 1 -> 2']
    """
    try:
        old = _flatten(yaml.safe_load(old_text) or {})
    except yaml.YAMLError:
        return ["(the previous config.yaml is not readable YAML)"]
    new = _flatten(yaml.safe_load(new_text) or {})
    missing = "<absent>"
    return [f"{key}: {old.get(key, missing)} -> {new.get(key, missing)}" for key in sorted(set(old) | set(new))
            if old.get(key, missing) != new.get(key, missing) and key not in IGNORED_CHANGES]


def write_config(run_dir: str, text: str) -> list[str]:
    """Write run_dir/config.yaml. A previous one that differs is kept as config.<time>.yaml, with a warning that
    names the changed keys; returns those changes."""
    path = Path(run_dir) / CONFIG_FILE
    old = path.read_text(errors="replace") if path.is_file() else None
    changes = config_changes(old, text) if old is not None and old != text else []
    if changes:
        kept = path.with_name(f"config.{time.strftime('%Y%m%d-%H%M%S')}.yaml")
        path.rename(kept)
        shown = "; ".join(changes[:MAX_CHANGES_SHOWN]) + \
            (f"; and {len(changes) - MAX_CHANGES_SHOWN} more" if len(changes) > MAX_CHANGES_SHOWN else "")
        log.warning("config: %d key(s) differ from the previous run of %s: %s. The previous config is kept as %s.",
                    len(changes), run_dir, shown, kept.name)
    path.write_text(text)
    return changes
