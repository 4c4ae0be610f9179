"""Say "no space left on device" when a write fails because the disk is full.

Libraries report a full disk in their own words (torch.save: "unexpected pos 704 vs 598"); `disk_full_message`
recognises it from the error chain (ENOSPC, EDQUOT) or from the free space left where the write went.
"""
from __future__ import annotations

import errno
import os
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
