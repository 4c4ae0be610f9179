"""Which run wrote what in a run directory. Plain files only: no torch.distributed.

    run_dir/run.json          {"run_id": the current run, "started_at", "resumed_from", "previous_run_ids"}
    run_dir/global_step_N/checkpoint.json   "run_id": the run that wrote this checkpoint
    run_dir/restarted-<time>/ what a `trainer.resume=restart` moved aside (never deleted)

A run keeps its id across resumes of its newest checkpoint; a fresh start, a restart, a resume from another
directory or from an older checkpoint of the same run (a branch) get a new one. Pruning deletes only
checkpoints of the current run (`layout.prune`), and `resume=auto` prefers the run that `latest` names.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from pathlib import Path

from rlhf_mcore.checkpoint.layout import LATEST_FILE, STEP_PREFIX, atomic_write_text, list_checkpoints, run_id_of

log = logging.getLogger(__name__)
RUN_FILE = "run.json"
ASIDE_PREFIX = "restarted-"
_USED = re.compile(rf"^{STEP_PREFIX}\d+(\.suspect)?$")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


def used_by(run_dir: str | os.PathLike) -> list[str]:
    """What makes `run_dir` a used run directory: its step directories and `latest` pointer (sorted names)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(c.name for c in run_dir.iterdir() if _USED.match(c.name) or c.name == LATEST_FILE)


def disable_refused(run_dir: str | os.PathLike, used: list[str]) -> str:
    """The one line that refuses `trainer.resume=disable` in a used directory."""
    shown = ", ".join(used[:6]) + (f" and {len(used) - 6} more" if len(used) > 6 else "")
    return (f"trainer.resume: 'disable' would start over in {run_dir}, which holds an earlier run ({shown}); nothing "
            "was changed. Continue it with trainer.resume=auto, start over with trainer.resume=restart (its files "
            f"are moved to {run_dir}/{ASIDE_PREFIX}<time>/, not deleted), or choose another trainer.output_dir.")


def move_aside(run_dir: str | os.PathLike, keep: tuple[str, ...] = ("run.lock",)) -> Path | None:
    """`trainer.resume=restart`: move everything of the earlier run (all but `keep` and earlier asides) into a
    dated `restarted-<time>` folder of `run_dir`; that folder, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    moving = [c for c in run_dir.iterdir() if c.name not in keep and not c.name.startswith(ASIDE_PREFIX)]
    if not moving:
        return None
    aside = run_dir / f"{ASIDE_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    while aside.exists():
        aside = aside.with_name(f"{aside.name}-{uuid.uuid4().hex[:4]}")
    aside.mkdir()
    for child in moving:
        child.rename(aside / child.name)
    log.warning("trainer.resume=restart: moved the earlier run's %d file(s) and folder(s) to %s (nothing deleted)",
                len(moving), aside)
    return aside


def read_run_record(run_dir: str | os.PathLike) -> dict:
    try:
        record = json.loads((Path(run_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _continues(run_dir: Path, resume_path: str | None, explicit: bool) -> str | None:
    """The run id a resume continues: that of the checkpoint when it lies in `run_dir` and (for an explicit
    trainer.resume=<path>) no newer complete checkpoint of the same run is there; else None (a new run)."""
    if resume_path is None or Path(resume_path).resolve().parent != run_dir.resolve():
        return None
    run_id = run_id_of(Path(resume_path))
    if run_id is None or not explicit:
        return run_id
    step = int(Path(resume_path).name[len(STEP_PREFIX):])
    newer = [p for s, p in list_checkpoints(run_dir) if s > step and run_id_of(p) == run_id]
    if newer:
        log.warning("resuming from %s while %s of the same run are newer: this is a new run (a branch); those stay",
                    Path(resume_path).name, ", ".join(p.name for p in newer))
        return None
    return run_id


def begin_run(run_dir: str | os.PathLike, resume_path: str | None, explicit: bool = False) -> str:
    """Rank 0, before the first save: decide this run's id and record it in run_dir/run.json."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    previous = read_run_record(run_dir)
    run_id = _continues(run_dir, resume_path, explicit) or new_run_id()
    history = list(previous.get("previous_run_ids", []))
    if previous.get("run_id") and previous["run_id"] != run_id:
        history.append(previous["run_id"])
    record = {"run_id": run_id, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from": resume_path,
              "previous_run_ids": history}
    atomic_write_text(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
    return run_id
