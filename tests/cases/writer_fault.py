"""`python -m tests.worker writer_fault --config ... [a.b=value ...]`: rlhf_mcore.train, with a fault
injected inside megatron's forked checkpoint writer processes (FileSystemWriterAsync.write_preloaded_data), once
per run (the first writer of the WRITER_FAULT_AT-th save that gets there):

    WRITER_FAULT=sigint-group  the writer sends SIGINT to the whole process group, as Ctrl-C in a terminal does
    WRITER_FAULT=sigint-group-twice  the same, twice, 0.3 s apart (Ctrl-C pressed again)
    WRITER_FAULT=die           the writer dies (SIGKILL to itself: the OOM killer)
"""
from __future__ import annotations

import functools
import os
import signal
import time


def install(fault: str, nth_save: int, flag_dir: str) -> None:
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    from rlhf_mcore.checkpoint import save_load

    saves = [0]
    original_save = save_load._save_role

    @functools.wraps(original_save)
    def counting_save(*args, **kwargs):
        saves[0] += 1
        return original_save(*args, **kwargs)

    original = FileSystemWriterAsync.write_preloaded_data

    @functools.wraps(original)
    def faulty(*args, **kwargs):
        if saves[0] == nth_save and _first(flag_dir):
            print(f"writer_fault_worker: {fault} in writer pid {os.getpid()}", flush=True)
            if fault.startswith("sigint-group"):
                os.killpg(os.getpgrp(), signal.SIGINT)
                if fault.endswith("twice"):
                    time.sleep(0.3)
                    os.killpg(os.getpgrp(), signal.SIGINT)
            elif fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    save_load._save_role = counting_save
    FileSystemWriterAsync.write_preloaded_data = staticmethod(faulty)


def _first(flag_dir: str) -> bool:
    """True in exactly one process (an O_EXCL marker file): one fault per run, however many writers."""
    try:
        os.close(os.open(os.path.join(flag_dir, "writer_fault.flag"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def entry(argv: list[str]) -> int:
    """rlhf_mcore.train's main (argv is its command line) with the fault installed."""
    install(os.environ["WRITER_FAULT"], int(os.environ.get("WRITER_FAULT_AT", "1")), os.environ["WRITER_FAULT_DIR"])
    from rlhf_mcore.train import main

    return main(argv)
