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
    def __init__(self, path: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(path)

    def write(self, step: int, metrics: dict) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Jsonl:
    def __init__(self, path: str):
        self.file = open(path, "a")

    def write(self, step: int, metrics: dict) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class MetricLogger:
    """Writes plain-float metric dicts to every configured sink; a no-op on ranks other than 0."""

    def __init__(self, run_dir: str, sinks: list[str], enabled: bool):
        self.sinks = []
        if not enabled:
            return
        if "jsonl" in sinks:
            self.sinks.append(_Jsonl(os.path.join(run_dir, "metrics.jsonl")))
        if "tensorboard" in sinks:
            try:
                self.sinks.append(_TensorBoard(os.path.join(run_dir, "tensorboard")))
            except ImportError:
                log.warning("tensorboard is not installed: TensorBoard logging is off")

    def write(self, step: int, metrics: dict) -> None:
        for sink in self.sinks:
            sink.write(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
