"""Where checkpoints live on disk, and which one to resume from. Plain files only: no torch.distributed.

    run_dir/
      latest_checkpointed_iteration.txt   "N": the newest complete checkpoint (written after the rename)
      global_step_N/
        checkpoint.json                    written last: step, roles, layout, optimizer kinds
        trainer_state.json                 the trainer's JSON state (`extra`)
        <role>/                            one megatron dist-checkpoint per role (model + optimizer)
        rng/rank_00000.pt                  RNG states of every rank
      global_step_M.tmp-<id>/              a save in progress, or one killed mid-way (ignored, then removed)

A directory counts as a checkpoint only when it is named `global_step_N` and holds `checkpoint.json`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

STEP_PREFIX = "global_step_"
LATEST_FILE = "latest_checkpointed_iteration.txt"
META_FILE = "checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.json"
RNG_DIR = "rng"
TMP_MARK = ".tmp-"
FORMAT = "rlhf-mcore-checkpoint/1"
FRESH_STARTS = ("disable", "restart")  # trainer.resume values that start from step 0 (see run_identity)
REQUIRED_META = {"step": int, "roles": dict, "layout": dict}  # what loading reads from checkpoint.json
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
_TMP_DIR = re.compile(rf"^{STEP_PREFIX}\d+{re.escape(TMP_MARK)}")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, or does not match what is being loaded into it."""


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / f"{STEP_PREFIX}{step}"


def tmp_dir_for(final: Path) -> Path:
    """A fresh sibling `global_step_N.tmp-<id>` of `final` (only rank 0's choice counts)."""
    return final.with_name(f"{final.name}{TMP_MARK}{uuid.uuid4().hex[:8]}")


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary sibling, fsync, then rename over `path`: readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}{TMP_MARK}{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_checkpoint(path: str | os.PathLike) -> bool:
    path = Path(path)
    return _STEP_DIR.match(path.name) is not None and (path / META_FILE).is_file()


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first; temporary and half-written directories are skipped."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / META_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def step_dirs(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every `global_step_N` directory of a run, complete or not (checkpoint.json lost), oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted((int(m.group(1)), c) for c in run_dir.iterdir() if (m := _STEP_DIR.match(c.name)) and c.is_dir())


def read_latest(run_dir: str | os.PathLike) -> int | None:
    """The step the `latest` pointer names; None when there is no pointer or it is unreadable."""
    try:
        text = (Path(run_dir) / LATEST_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def find_latest(run_dir: str | os.PathLike) -> str | None:
    """The newest complete checkpoint of `run_dir`: the `latest` pointer when it names a complete
    checkpoint, else the highest complete `global_step_N` (a save killed before the pointer was
    written); None when there is none."""
    run_dir = Path(run_dir)
    pointer = run_dir / LATEST_FILE
    if pointer.is_file():
        text = pointer.read_text().strip()
        if text.isdigit() and is_checkpoint(step_dir(run_dir, int(text))):
            return str(step_dir(run_dir, int(text)))
        log.warning("%s: names %r, which is not a complete checkpoint; using the newest one on disk", pointer, text)
    found = list_checkpoints(run_dir)
    return str(found[-1][1]) if found else None


def write_latest(run_dir: Path, step: int) -> None:
    atomic_write_text(run_dir / LATEST_FILE, f"{step}\n")


def read_meta(path: str | os.PathLike) -> dict:
    """checkpoint.json of a checkpoint directory, or an error saying what `path` is instead."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory. Pass a global_step_N directory written by "
                              "save_checkpoint (or trainer.resume=auto to pick the newest one).")
    meta_path = path / META_FILE
    if not meta_path.is_file():
        hint = "it is not a checkpoint written by save_checkpoint."
        if list_checkpoints(path) or (path / LATEST_FILE).exists():
            hint = f"it looks like a run directory; pass one of its global_step_N directories ({find_latest(path)})."
        elif (path / "metadata.json").is_file():
            hint = "it is a plain model dist-checkpoint (e.g. from tools/convert_checkpoint.py); load it with " \
                   "load_model_weights (model.load / critic.load / ref.load)."
        elif TMP_MARK in path.name:
            hint = "it is an unfinished save (killed or failed before completion)."
        raise CheckpointError(f"{path}: no {META_FILE}: {hint}")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{meta_path}: unreadable ({type(e).__name__}: {e}); the checkpoint is damaged.") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        meta = meta if isinstance(meta, dict) else {}
        raise CheckpointError(f"{meta_path}: unknown checkpoint format {meta.get('format')!r} (expected {FORMAT!r}).")
    missing = [k for k, kind in REQUIRED_META.items() if not isinstance(meta.get(k), kind)]
    if missing:
        raise CheckpointError(f"{meta_path}: incomplete (missing or malformed: {', '.join(missing)}); the checkpoint "
                              "is damaged.")
    return meta


def remove_orphans(run_dir: str | os.PathLike, keep: Path | None = None) -> list[Path]:
    """Delete `global_step_N.tmp-*` directories left by killed or failed saves (all but `keep`)."""
    run_dir = Path(run_dir)
    removed = []
    if not run_dir.is_dir():
        return removed
    for child in run_dir.iterdir():
        if _TMP_DIR.match(child.name) and child.is_dir() and child != keep:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    if removed:
        log.info("removed %d unfinished checkpoint dir(s): %s", len(removed), ", ".join(p.name for p in removed))
    return removed


def retire(path: Path) -> None:
    """Remove a checkpoint so that no reader ever sees it half-deleted: rename it to a temporary name first."""
    doomed = tmp_dir_for(path)
    path.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def run_id_of(path: Path) -> str | None:
    """The run id a checkpoint was written by (None: saved before run ids, or checkpoint.json unreadable)."""
    try:
        return json.loads((path / META_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def prune(run_dir: str | os.PathLike, keep: int, newest: Path) -> list[Path]:
    """Keep `newest` and the `keep - 1` highest older checkpoints of the same run; delete the other older ones of
    that run. Checkpoints of other runs, or newer than `newest`, are never touched. A checkpoint that cannot be
    deleted is a warning: the run goes on."""
    if keep < 1:
        raise CheckpointError(f"trainer.max_checkpoints_to_keep: must be >= 1 (got {keep}). Set a positive value.")
    newest = Path(newest)
    run_id, step = run_id_of(newest), int(_STEP_DIR.match(newest.name).group(1))
    older = [p for s, p in list_checkpoints(run_dir) if s < step and run_id_of(p) == run_id]
    doomed, deleted = older[: max(0, len(older) - (keep - 1))], []
    for path in doomed:
        try:
            retire(path)
            deleted.append(path)
        except OSError as e:
            log.warning("%s: could not delete this old checkpoint (%s: %s); the run goes on. Delete it by hand, or "
                        "fix its permissions.", path, type(e).__name__, e)
    if deleted:
        log.info("deleted old checkpoint(s) %s (keeping %d)", ", ".join(p.name for p in deleted), keep)
    return deleted


def resolve_resume(trainer_cfg, run_dir: str | os.PathLike) -> str | None:
    """trainer.resume: 'auto' -> newest checkpoint of run_dir (None when there is none), 'disable' / 'restart' ->
    None, anything else -> that checkpoint directory (or the newest checkpoint of that run directory)."""
    resume = str(trainer_cfg.resume)
    if resume in FRESH_STARTS:
        return None
    if resume == "auto":
        return find_latest(run_dir)
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(f"trainer.resume: checkpoint not found (got {resume!r}). Pass an existing "
                              "global_step_N directory, 'auto' (newest in trainer.output_dir), 'disable' or 'restart'.")
    if not is_checkpoint(path) and (list_checkpoints(path) or (path / LATEST_FILE).exists()):
        latest = find_latest(path)
        if latest is None:
            raise CheckpointError(f"trainer.resume: {resume!r} is a run directory with no complete checkpoint. "
                                  "Pass a global_step_N directory, 'auto' or 'disable'.")
        return latest
    read_meta(path)  # raises with what the directory is instead
    return str(path)
