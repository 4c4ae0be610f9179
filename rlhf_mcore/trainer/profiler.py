"""`trainer.profile_steps`: torch.profiler around the chosen steps, summarised per phase.

For each profiled step, rank 0 writes under `<output_dir>/profile/`:
- `step_<N>.json`: per phase (the step's timers: gen, old_log_prob, ref, update_actor, ...) the wall seconds,
  the GPU busy seconds (kernels that ran inside the phase), the kernel launches and the host syncs (a CPU wait
  on the device: stream/device/event synchronize, device-to-host copies). Busy / wall near 1 means the phase is
  bound by the device; a low ratio with many launches means it waits for Python and kernel launches.
- `step_<N>.txt`: the profiler's table of the 40 most expensive operators (device time, then host time).
- `step_<N>.trace.json.gz` with `trainer.profile_trace: true` (chrome://tracing, Perfetto).

The phases are marked with `torch.profiler.record_function("phase/<name>")` by `rlhf_mcore.logs.timer`.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)
PHASE_PREFIX = "phase/"
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
DTOH = "Memcpy DtoH"


def _is_device(event) -> bool:
    return event.device_type == torch.autograd.DeviceType.CUDA


def _inside(event, window) -> bool:
    return window[0] <= event.time_range.start and event.time_range.end <= window[1]


def _is_sync(name: str) -> bool:
    return name in SYNCS or name.startswith("cudaMemcpy") and "DtoH" in name


def phase_summary(events) -> dict[str, dict]:
    """Per phase: wall_s, device_busy_s (kernel time inside it), busy_frac, launches, host_syncs, dtoh_copies.
    `events`: the profiler's FunctionEvents. Nested phases (none today) would count in both."""
    windows = {}
    for e in events:
        if e.name.startswith(PHASE_PREFIX) and not _is_device(e):
            name = e.name[len(PHASE_PREFIX):]
            windows.setdefault(name, []).append((e.time_range.start, e.time_range.end))
    out = {}
    for name, spans in windows.items():
        wall = sum(b - a for a, b in spans) / 1e6
        busy = launches = syncs = dtoh = 0
        for e in events:
            if not any(_inside(e, w) for w in spans):
                continue
            if _is_device(e):
                busy += e.time_range.end - e.time_range.start if "memcpy" not in e.name.lower() else 0
                dtoh += DTOH in e.name
            elif e.name in LAUNCHES:
                launches += 1
            elif _is_sync(e.name):
                syncs += 1
        out[name] = {"wall_s": round(wall, 4), "device_busy_s": round(busy / 1e6, 4),
                     "busy_frac": round(busy / 1e6 / wall, 4) if wall else 0.0,
                     "launches": launches, "host_syncs": syncs, "dtoh_copies": dtoh}
    return out


def format_summary(step: int, summary: dict[str, dict]) -> str:
    head = f"profile step {step}: {'phase':<14} {'wall s':>8} {'busy s':>8} {'busy':>6} {'launches':>9} " \
           f"{'syncs':>6} {'DtoH':>6}"
    rows = [f"{'':>{len(f'profile step {step}: ')}}{name:<14} {s['wall_s']:>8.3f} {s['device_busy_s']:>8.3f} "
            f"{s['busy_frac']:>6.0%} {s['launches']:>9} {s['host_syncs']:>6} {s['dtoh_copies']:>6}"
            for name, s in summary.items()]
    return "\n".join([head, *rows])


@contextlib.contextmanager
def profile_step(trainer_cfg, step: int, rank: int):
    """Profiles the block when `step` (1-based, as the step line prints it) is in trainer.profile_steps."""
    if step not in trainer_cfg.profile_steps:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield
    if rank == 0:
        write_profile(prof, Path(trainer_cfg.output_dir) / "profile", step, trainer_cfg.profile_trace)


def write_profile(prof, folder: Path, step: int, trace: bool) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    events = prof.events()
    summary = phase_summary(events)
    (folder / f"step_{step}.json").write_text(json.dumps(summary, indent=1) + "\n")
    averages = prof.key_averages()
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    tables = [averages.table(sort_by=sort, row_limit=40)]
    if torch.cuda.is_available():
        tables.append(averages.table(sort_by="self_cpu_time_total", row_limit=40))
    (folder / f"step_{step}.txt").write_text("\n\n".join(tables) + "\n")
    if trace:
        raw = folder / f"step_{step}.trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
    log.info("%s\n(written to %s)", format_summary(step, summary), folder)
    return summary
