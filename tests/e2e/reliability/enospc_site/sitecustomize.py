"""Injected into a training run's processes (PYTHONPATH) by test_disk_full: writes fail with ENOSPC.

RLHF_ENOSPC=<substring>: every file opened for writing whose path holds it fails on write;
RLHF_ENOSPC=safetensors: the HF export's safetensors writer fails as it does on a full disk: it writes from Rust,
not through open, and raises SafetensorError (not an OSError) with the system's message.
"""
import builtins
import errno
import io
import os

TARGET = os.environ.get("RLHF_ENOSPC", "")


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
    def __init__(self, file):
        self._file = file

    def write(self, data):
        _full()

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def _full_rust(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(errno.ENOSPC)} (os error 28)")


if TARGET == "safetensors":
    import safetensors.torch

    safetensors.torch.save_file = _full_rust
elif TARGET:
    _open = io.open

    def _open_full(file, mode="r", *args, **kwargs):
        handle = _open(file, mode, *args, **kwargs)
        writing = any(c in mode for c in "wax+")
        return _FullFile(handle) if writing and TARGET in str(file) else handle

    builtins.open = io.open = _open_full
