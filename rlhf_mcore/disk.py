"""Writes that survive a full disk or a crash: say "no space left on device" when a write fails because the
disk is full, and publish a finished directory atomically.

Libraries report a full disk in their own words (torch.save: "unexpected pos 704 vs 598"); `disk_full_message`
recognises it from the error chain (ENOSPC, EDQUOT) or from the free space left where the write went.
`publish_dir` is the one way a directory written in a temporary sibling (checkpoints, converted and exported
models) replaces its final name: readers see the old directory or the new one, never a half-written one.
"""
from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

FULL_BELOW_BYTES = 1 << 20  # less than this free counts as full


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged process may still write on the file system of `path` (its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def is_disk_full(err: BaseException) -> bool:
    """True when `err` or an error it was raised from is ENOSPC or EDQUOT (or says so in its text, as errors
    re-raised by worker processes do).

    >>> is_disk_full(RuntimeError("wrapped")), is_disk_full(OSError(errno.ENOSPC, "full"))
    (False, True)
    """
    marks = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or any(m in str(e) for m in marks)
               for e in _chain(err))


def disk_full_message(err: BaseException, path: str | os.PathLike) -> str | None:
    """A one-line explanation when `err` (writing under `path`) comes from a full disk, else None."""
    marks = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))  # also in errors re-raised as text by workers
    by_errno = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or
                   any(m in str(e) for m in marks) for e in _chain(err))
    free = free_bytes(path)
    if not by_errno and (free is None or free >= FULL_BELOW_BYTES):
        return None
    left = "" if free is None else f"; {free / 2**20:.1f} MiB free"
    lines = str(err).strip().splitlines() or [""]
    cause = next((line for line in lines if any(m in line for m in marks)), lines[0]).strip()[:200]
    return (f"no space left on device (ENOSPC) writing {path}{left} ({type(err).__name__}: {cause}). Free disk "
            "space, lower trainer.max_checkpoints_to_keep, or set trainer.output_dir to a larger disk.")


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames inside `path` durable (a crash of the machine, not only of the process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: str | os.PathLike, final: str | os.PathLike, aside: str | os.PathLike | None = None) -> Path:
    """Rename the finished directory `tmp` to its sibling `final`. An existing `final` is renamed to `aside` (by
    default a hidden `.<name>.old-<id>` sibling) first, put back if the rename fails, and deleted after it.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> for name, text in (("new", "2"), ("out", "1")):
    ...     _ = (root / name).mkdir(), (root / name / "f").write_text(text)
    >>> publish_dir(root / "new", root / "out") == root / "out", (root / "out" / "f").read_text()
    (True, '2')
    >>> sorted(p.name for p in root.iterdir())  # the old copy is gone
    ['out']
    """
    tmp, final = Path(tmp), Path(final)
    moved = None
    if final.exists():
        moved = Path(aside) if aside is not None else final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        final.rename(moved)
    try:
        os.rename(tmp, final)
    except OSError:
        if moved is not None:
            moved.rename(final)
        raise
    fsync_dir(final.parent)
    if moved is not None:
        shutil.rmtree(moved, ignore_errors=True)
    return final
