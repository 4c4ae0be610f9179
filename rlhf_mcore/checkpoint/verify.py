"""Checksums of a checkpoint's files: recorded at save (in checkpoint.json, under "files"), verified on load.

Collective and cheap per rank: file i of the sorted list is hashed by rank i % world_size, and the ranks
exchange their results, so every rank reaches the same verdict. A checkpoint saved before checksums existed
(no "files" entry) loads with a warning.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch.distributed as dist

from rlhf_mcore.checkpoint.layout import (
    FRESH_STARTS,
    LATEST_FILE,
    META_FILE,
    CheckpointError,
    is_checkpoint,
    read_latest,
    read_meta,
    resolve_resume,
    run_id_of,
    step_dirs,
)

log = logging.getLogger(__name__)
ALGORITHM = "sha256"


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj) -> list:
    rank, world = _world()
    if world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGORITHM).hexdigest()


def checkpoint_files(root: Path) -> list[str]:
    """Every file of a checkpoint directory but checkpoint.json (which holds the checksums), sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != META_FILE)


def record_checksums(root: Path) -> dict[str, list]:
    """Collective: {relative path: [size, sha256]} of every file under `root` (rank 0's listing)."""
    rank, world = _world()
    names = [checkpoint_files(root) if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(names, src=0)
    mine = {n: [(root / n).stat().st_size, file_digest(root / n)] for i, n in enumerate(names[0]) if i % world == rank}
    return {k: v for part in _gather(mine) for k, v in part.items()}


def _file_problem(root: Path, name: str, size: int, digest: str) -> str | None:
    path = root / name
    if not path.is_file():
        return f"{path}: missing"
    actual = path.stat().st_size
    if actual != size:
        return f"{path}: size {actual} bytes, recorded {size} (truncated or overwritten)"
    if file_digest(path) != digest:
        return f"{path}: {ALGORITHM} checksum differs from the one recorded at save (the file is corrupt)"
    return None


def _local_problems(root: Path) -> list[str]:
    rank, world = _world()
    try:
        meta = read_meta(root)
    except CheckpointError as e:
        return [str(e)] if rank == 0 else []
    files = meta.get("files")
    if files is None:
        if rank == 0:
            log.warning("%s: saved without checksums (an older version); loading it unverified", root)
        return []
    problems = []
    for i, (name, (size, digest)) in enumerate(sorted(files.items())):
        if i % world == rank:
            problem = _file_problem(root, name, size, digest)
            if problem:
                problems.append(problem)
    return problems


def checkpoint_problems(path) -> list[str]:
    """Collective: what is wrong with checkpoint `path` (missing, truncated or corrupt files); [] if intact."""
    return sorted(p for part in _gather(_local_problems(Path(path))) for p in part)


def verify_checkpoint(path) -> None:
    """Collective: raise CheckpointError naming the first bad file of `path`, on every rank alike."""
    problems = checkpoint_problems(path)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {path} is damaged: {problems[0]}{more}. Resume from another "
                              "checkpoint (trainer.resume=<path>, or trainer.resume=auto picks the newest intact one).")


def _resume_order(run_dir) -> list[Path]:
    """Every step directory, the most wanted first: the checkpoints of the run that `latest` names (newest
    first), then the others by step. A save killed between its rename and the pointer still comes first."""
    found = step_dirs(run_dir)
    pointer = read_latest(run_dir)
    head = dict(found).get(pointer)
    run_id = run_id_of(head) if head is not None and is_checkpoint(head) else None
    ours = [p for _, p in reversed(found) if head is not None and is_checkpoint(p) and run_id_of(p) == run_id]
    return ours + [p for _, p in reversed(found) if p not in ours]


def newest_intact(run_dir) -> str | None:
    """Collective: the newest checkpoint of `run_dir` whose files all verify (see _resume_order); damaged ones
    are skipped with a warning that names the bad file. None when there is no checkpoint, no step directory
    and no `latest` pointer at all; CheckpointError listing the damage when there are some but none verifies."""
    damaged = []
    for path in _resume_order(run_dir):
        problems = checkpoint_problems(path)
        if not problems:
            return str(path)
        damaged.append(f"{path.name}: {problems[0]}")
        if _world()[0] == 0:
            log.warning("resume: skipping damaged checkpoint %s: %s; trying the previous one", path.name, problems[0])
    pointer = Path(run_dir) / LATEST_FILE
    if pointer.exists() and not damaged:
        damaged.append(f"{pointer}: names step {read_latest(run_dir)}, and there is no global_step_N directory")
    if damaged:
        raise CheckpointError(f"{run_dir}: none of its {len(damaged)} checkpoint(s) is intact: {'; '.join(damaged)}. "
                              "Nothing was changed. Repair or restore them, resume from a checkpoint elsewhere "
                              "(trainer.resume=<path>), start over with trainer.resume=restart (moves them aside), or "
                              "choose another trainer.output_dir.")
    return None


def pick_resume(trainer_cfg, run_dir) -> str | None:
    """Collective: the verified checkpoint that trainer.resume names (see layout.resolve_resume); 'auto' and a
    run directory give the newest intact checkpoint, an explicit global_step_N must verify itself."""
    resume = str(trainer_cfg.resume)
    if resume in FRESH_STARTS:
        return None
    if resume == "auto":
        return newest_intact(run_dir)
    path = resolve_resume(trainer_cfg, run_dir)  # raises when `resume` names nothing usable
    if not is_checkpoint(resume):
        return newest_intact(resume)
    verify_checkpoint(path)
    return path
