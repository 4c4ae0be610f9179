"""Logging: one `init_logger()`, `MetricLogger` fanning a step's metrics out to JSONL, TensorBoard and
wandb, `timer(name, timings)` for per-phase seconds, `progress(...)` for long phases: a tqdm bar on a
terminal, a plain log line every few seconds when stdout is a file or a pipe (no 7k-character bar lines), and
`log_once(...)` for a message worth saying once per process."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Hashable

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


_logged_once: set[tuple[str, Hashable]] = set()
_logged_once_lock = threading.Lock()


def log_once(logger: logging.Logger, key: Hashable, message: str, *args, level: int = logging.INFO) -> bool:
    """`logger.log(level, message, *args)` the first time this process sees (logger name, key); later calls
    with the same pair are silent. Returns whether it logged. (Every role builds its model and train state, so
    a choice made per build is announced once, not once per role.)"""
    seen = (logger.name, key)
    if seen in _logged_once:  # the common case (a per-forward call), without the lock
        return False
    with _logged_once_lock:
        if seen in _logged_once:
            return False
        _logged_once.add(seen)
    logger.log(level, message, *args, stacklevel=2)  # the record names the caller, not this helper
    return True


def reset_log_once() -> None:
    """Forget what `log_once` logged (tests that assert on a once-per-process line)."""
    with _logged_once_lock:
        _logged_once.clear()


@contextlib.contextmanager
def timer(name: str, timings: dict):
    """Adds the wall seconds of the block to timings[name] (synchronising CUDA so GPU work is counted); on CUDA
    also the block's peak allocated memory to PHASE_PEAKS[name] (phases do not nest)."""
    cuda = torch.cuda.is_available()
    restart_phase_peak()
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(f"phase/{name}"):  # trainer.profile_steps sums per phase
            yield
    finally:
        if cuda and name not in ENDED_PEAKS:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            PHASE_PEAKS[name] = max(PHASE_PEAKS.get(name, 0), peak)
            RUN_PEAK[0] = max(RUN_PEAK[0], peak)
        ENDED_PEAKS.discard(name)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


ENDED_PEAKS: set[str] = set()  # running phases whose peak `end_phase_peak` has already taken


def end_phase_peak(name: str) -> None:
    """Take the running phase's peak now (CUDA): what its timer still runs after this is not the phase's own memory.
    The rollout's: trainer.offload_during_rollout reloads the training state inside the "gen" timer, and the
    generation's peak (the memory plan's rollout) must not include it. The run's peak still sees the reload."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        PHASE_PEAKS[name] = max(PHASE_PEAKS.get(name, 0), peak)
        RUN_PEAK[0] = max(RUN_PEAK[0], peak)
        ENDED_PEAKS.add(name)


PHASE_PEAKS: dict[str, int] = {}  # bytes allocated at each phase's peak since the last `take_phase_peaks` (CUDA)
RUN_PEAK = [0]  # the run's peak bytes: reset_peak_memory_stats per phase would hide it from torch


def restart_phase_peak() -> None:
    """Count the running phase's peak from here (CUDA; the run's peak keeps what came before): as each phase starts
    (`timer`), and after trainer.offload_during_rollout has moved the training state out, so that the rollout's peak
    is the generation's, not the state it entered with."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        RUN_PEAK[0] = max(RUN_PEAK[0], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()


PHASE_DEVICE: dict[str, int] = {}  # device bytes in use by every process, seen in a phase (`note_device_used`)


def note_device_used(name: str) -> None:
    """Record, under phase `name`, the device memory in use now by every process (`torch.cuda.mem_get_info`; CUDA
    only): an SGLang engine's scheduler process holds its KV pool where max_memory_allocated cannot see it."""
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        PHASE_DEVICE[name] = max(PHASE_DEVICE.get(name, 0), total - free)


def take_device_used() -> dict[str, int]:
    """The phases' device memory in use (`note_device_used`) since the last call (emptied)."""
    used = dict(PHASE_DEVICE)
    PHASE_DEVICE.clear()
    return used


def take_phase_peaks() -> dict[str, int]:
    """The phases' peaks since the last call (emptied)."""
    peaks = dict(PHASE_PEAKS)
    PHASE_PEAKS.clear()
    return peaks


PROGRESS_EVERY_S = float(os.environ.get("RLHF_MCORE_PROGRESS_S", "20"))


class _LineProgress:
    """tqdm's update/close/context protocol, reporting as a log line at most every `every_s` seconds."""

    def __init__(self, total: int, desc: str, unit: str, every_s: float):
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n, self.start, self.last, self.reported = 0, time.perf_counter(), time.perf_counter(), False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.every_s and self.n < self.total:
            self.last, self.reported = now, True
            log.info("%s: %d/%d %s (%.0f%%, %.0f s)", self.desc, self.n, self.total, self.unit,
                     100.0 * self.n / max(self.total, 1), now - self.start)

    def close(self) -> None:
        if self.reported:  # short phases stay silent; long ones say that they ended
            log.info("%s: %d/%d %s done in %.0f s", self.desc, self.n, self.total, self.unit,
                     time.perf_counter() - self.start)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _NoProgress(_LineProgress):
    def __init__(self):
        super().__init__(0, "", "", float("inf"))

    def close(self) -> None:
        pass


def progress(total: int, desc: str, enabled: bool = True, unit: str = "it", every_s: float | None = None):
    """A progress reporter with tqdm's update/close: a bar on a terminal, periodic log lines otherwise."""
    if not enabled:
        return _NoProgress()
    if sys.stdout.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False)
    return _LineProgress(total, desc, unit, PROGRESS_EVERY_S if every_s is None else every_s)


@contextlib.contextmanager
def heartbeat(desc: str, every_s: float | None = None, enabled: bool = True):
    """For a phase that cannot count its work (one library call): 'desc: still running (N s)' every
    `every_s` seconds from a background thread, until the block ends."""
    every_s = PROGRESS_EVERY_S if every_s is None else every_s
    done = threading.Event()
    start = time.perf_counter()

    def beat():
        while not done.wait(every_s):
            log.info("%s: still running (%.0f s)", desc, time.perf_counter() - start)

    thread = threading.Thread(target=beat, daemon=True) if enabled else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread prints the traceback of a failed write (a full disk), then the writer raises
    the same error at its next write, flush or close in the main thread: print nothing for the thread."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args):
        if type(args.thread).__name__ != "_AsyncWriterThread":
            previous(args)

    hook.quiet_tensorboard = True
    threading.excepthook = hook


class _TensorBoard:
    def __init__(self, path: str, truncate_after: int):
        from torch.utils.tensorboard import SummaryWriter

        _quiet_tensorboard_thread()
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
            from rlhf_mcore.disk import disk_full_message  # here, so logs imports none of ours (models use it)

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


class _Wandb:
    """wandb, imported only when `trainer.logger` names it; WANDB_MODE=offline works without a network."""

    def __init__(self, run_dir: str, project: str, name: str, config: dict | None):
        try:
            import wandb
        except ImportError as err:
            raise ValueError("trainer.logger: 'wandb' is listed but the wandb package is not installed (got "
                             "wandb). Run `pip install wandb`, or drop wandb from trainer.logger.") from err
        self.wandb = wandb
        self.run = wandb.init(project=project, name=name or os.path.basename(os.path.normpath(run_dir)),
                              dir=run_dir, config=config or {})

    def write(self, step: int, metrics: dict) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def sink_errors(run_dir: str, sinks: list[str]) -> list[str]:
    """Problems opening the metric sinks that write under `run_dir` (metrics.jsonl, tensorboard/), one line each:
    found at start-up, before any model is built, instead of as a traceback at the first step."""
    targets = {"jsonl": os.path.join(run_dir, "metrics.jsonl"), "tensorboard": os.path.join(run_dir, "tensorboard")}
    errors = []
    for sink, path in targets.items():
        if sink not in sinks:
            continue
        try:
            if sink == "jsonl":
                open(path, "a").close()
            else:
                os.makedirs(path, exist_ok=True)
        except OSError as e:
            errors.append(f"trainer.logger={sink}: cannot write {path} ({e.strerror or e}). Remove or fix it, or "
                          f"leave {sink} out of trainer.logger.")
    return errors


class MetricLogger:
    """Writes plain-float metric dicts to every configured sink; a no-op on ranks other than 0.
    truncate_after: the step the run starts from; records of later steps (from before a resume) are dropped."""

    def __init__(self, run_dir: str, sinks: list[str], enabled: bool, truncate_after: int = 0,
                 project: str = "rlhf_mcore", name: str = "", config: dict | None = None):
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
        if "wandb" in sinks:
            self.sinks.append(_Wandb(run_dir, project, name, config))

    def write(self, step: int, metrics: dict) -> None:
        for sink in self.sinks:
            sink.write(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
