"""Logging: one `init_logger()`, `MetricLogger` fanning a step's metrics out to
console, JSONL and TensorBoard, and `timer(name, timings)` for per-phase seconds."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time

import torch

from rlhf_mcore.disk import disk_full_message

log = logging.getLogger("rlhf_mcore")


def init_logger(rank: int = 0, level: int = logging.INFO) -> None:
    """stdlib logging on rank 0 only (other ranks print warnings and errors)."""
    prefix = "[%(asctime)s]" if rank == 0 else f"[rank{rank}]"
    fmt = prefix + " %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level if rank == 0 else logging.WARNING, format=fmt, datefmt="%H:%M:%S",
                        stream=sys.stdout, force=True)
    for noisy in ("megatron", "torch.distributed", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextlib.contextmanager
def timer(name: str, timings: dict):
    """Adds the wall seconds of the block to timings[name] (synchronising CUDA so GPU work is counted)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


class _TensorBoard:
    def __init__(self, path: str, truncate_after: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(path, purge_step=truncate_after + 1)  # drops events of later steps

    def write(self, step: int, metrics: dict) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Jsonl:
    def __init__(self, path: str, truncate_after: int):
        self.path = path
        _truncate_jsonl(path, truncate_after)
        self.file = open(path, "a")

    def write(self, step: int, metrics: dict) -> None:
        try:
            self.file.write(json.dumps({"step": step, **metrics}) + "\n")
            self.file.flush()
        except OSError as e:
            raise OSError(e.errno, disk_full_message(e, self.path) or f"writing {self.path} failed: {e}") from e

    def close(self) -> None:
        self.file.close()


def _truncate_jsonl(path: str, last_step: int) -> None:
    """Keep only the records of steps <= last_step (a resumed run re-logs the steps after its checkpoint)."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = [line for line in lines if _step_of(line) is not None and _step_of(line) <= last_step]
    if len(kept) == len(lines):
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)
    log.info("%s: dropped %d record(s) after step %d", path, len(lines) - len(kept), last_step)


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line of a killed run


class MetricLogger:
    """Writes plain-float metric dicts to every configured sink; a no-op on ranks other than 0.
    truncate_after: the step the run starts from; records of later steps (from before a resume) are dropped."""

    def __init__(self, run_dir: str, sinks: list[str], enabled: bool, truncate_after: int = 0):
        self.sinks = []
        if not enabled:
            return
        if "jsonl" in sinks:
            self.sinks.append(_Jsonl(os.path.join(run_dir, "metrics.jsonl"), truncate_after))
        if "tensorboard" in sinks:
            try:
                self.sinks.append(_TensorBoard(os.path.join(run_dir, "tensorboard"), truncate_after))
            except ImportError:
                log.warning("tensorboard is not installed: TensorBoard logging is off")

    def write(self, step: int, metrics: dict) -> None:
        for sink in self.sinks:
            sink.write(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
