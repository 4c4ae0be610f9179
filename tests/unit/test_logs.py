"""Loggers and progress: wandb imported only when named (offline through its own API), periodic progress
lines when stdout is not a terminal, a heartbeat for phases that cannot count their work, and log_once."""
import json
import logging
import sys
import types

import pytest
import torch

from rlhf_mcore import logs
from rlhf_mcore.logs import MetricLogger, heartbeat, log_once, progress, reset_log_once


class FakeRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def finish(self):
        self.finished = True


def test_wandb_is_imported_only_when_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` now raises ImportError
    logger = MetricLogger(str(tmp_path), ["jsonl", "console"], enabled=True)
    logger.write(1, {"critic/score/mean": 0.5})
    logger.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "critic/score/mean": 0.5}
    with pytest.raises(ValueError, match="trainer.logger: 'wandb' is listed but the wandb package is not installed"):
        MetricLogger(str(tmp_path), ["wandb"], enabled=True)


def test_wandb_sink_logs_every_step_and_finishes(tmp_path, monkeypatch):
    runs = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    logger = MetricLogger(str(tmp_path / "my_run"), ["wandb"], enabled=True, project="p", config={"a": 1})
    logger.write(1, {"x": 1.0})
    logger.write(2, {"x": 2.0})
    logger.close()
    (run,) = runs
    assert run.kwargs["project"] == "p" and run.kwargs["name"] == "my_run" and run.kwargs["config"] == {"a": 1}
    assert run.logged == [(1, {"x": 1.0}), (2, {"x": 2.0})] and run.finished


def test_wandb_offline_for_real_when_installed(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = MetricLogger(str(tmp_path), ["wandb"], enabled=True)
    logger.write(1, {"x": 1.0})
    logger.close()
    assert list(tmp_path.glob("wandb/offline-run-*"))


def test_progress_is_periodic_lines_without_a_terminal(caplog, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    with caplog.at_level(logging.INFO, logger="rlhf_mcore"):
        with progress(3, "old_log_prob", unit="micro-batches", every_s=0.0) as bar:
            for _ in range(3):
                bar.update(1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("old_log_prob: 1/3 micro-batches (33%") and lines[1].startswith("old_log_prob: 2/3")
    assert lines[-1].startswith("old_log_prob: 3/3 micro-batches done in") and all(len(x) < 120 for x in lines)


def test_short_phases_stay_silent_and_disabled_progress_is_silent(caplog, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    with caplog.at_level(logging.INFO, logger="rlhf_mcore"):
        with progress(2, "gen", every_s=3600) as bar:
            bar.update(2)
        with progress(2, "gen", enabled=False, every_s=0.0) as bar:
            bar.update(2)
    assert caplog.records == []


def test_heartbeat_reports_while_the_block_runs(caplog):
    import time

    with caplog.at_level(logging.INFO, logger="rlhf_mcore"):
        with heartbeat("converting", every_s=0.05):
            time.sleep(0.3)
    beats = [r.getMessage() for r in caplog.records if r.getMessage().startswith("converting: still running")]
    assert len(beats) >= 2
    assert logs.PROGRESS_EVERY_S > 0


def test_log_once_logs_each_key_once_per_logger_until_reset(caplog):
    reset_log_once()
    first, other = logging.getLogger("rlhf_mcore.test_once"), logging.getLogger("rlhf_mcore.test_once_other")
    with caplog.at_level(logging.DEBUG, logger="rlhf_mcore"):
        assert log_once(first, "a", "kernel: %s (%s)", "sdpa", "cpu") is True
        assert log_once(first, "a", "kernel: %s (%s)", "other", "cpu") is False  # same key: silent
        assert log_once(first, ("b", 1), "fallback", level=logging.WARNING) is True
        assert log_once(other, "a", "same key, another logger") is True
        reset_log_once()
        assert log_once(first, "a", "again after reset") is True
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [("rlhf_mcore.test_once", logging.INFO, "kernel: sdpa (cpu)"),
                   ("rlhf_mcore.test_once", logging.WARNING, "fallback"),
                   ("rlhf_mcore.test_once_other", logging.INFO, "same key, another logger"),
                   ("rlhf_mcore.test_once", logging.INFO, "again after reset")]
    assert {r.funcName for r in caplog.records} == {"test_log_once_logs_each_key_once_per_logger_until_reset"}
    reset_log_once()


def test_timer_records_each_phases_peak_and_keeps_the_runs(monkeypatch):
    """On CUDA each phase's peak allocation is its own (the peak is reset as the phase starts), and the run's peak
    survives the resets (perf/max_memory_gb)."""
    from rlhf_mcore.trainer.step_log import peak_memory_gb

    allocated = {"now": 0, "peak": 0}

    def alloc(n):
        allocated["now"] = n
        allocated["peak"] = max(allocated["peak"], n)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: allocated.update(peak=allocated["now"]))
    saved, logs.RUN_PEAK[0] = logs.RUN_PEAK[0], 0
    logs.take_phase_peaks()
    timings: dict = {}
    with logs.timer("gen", timings):
        alloc(10 * 2**30)
        alloc(2 * 2**30)
    with logs.timer("update_actor", timings):
        alloc(6 * 2**30)
    assert logs.take_phase_peaks() == {"gen": 10 * 2**30, "update_actor": 6 * 2**30}
    assert logs.take_phase_peaks() == {} and set(timings) == {"gen", "update_actor"}
    assert peak_memory_gb() == 10.0
    logs.RUN_PEAK[0] = saved


def test_an_offload_restarts_the_phases_peak_and_the_device_use_is_noted(monkeypatch):
    """trainer.offload_during_rollout: the state the rollout entered with counts for the run's peak, not the
    generation's (`restart_phase_peak`); the device memory in use by every process (an SGLang scheduler's pool)
    is noted per phase, the largest kept, then taken once."""
    allocated = {"now": 0, "peak": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: allocated.update(peak=allocated["now"]))
    device = {"free": 100 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (device["free"], 140 * 2**30))
    saved, logs.RUN_PEAK[0] = logs.RUN_PEAK[0], 0
    logs.take_phase_peaks(), logs.take_device_used()
    allocated.update(now=120 * 2**30, peak=120 * 2**30)  # the training state, before the offload
    with logs.timer("gen", {}):
        allocated.update(now=40 * 2**30)  # offloaded
        logs.restart_phase_peak()
        allocated.update(now=45 * 2**30, peak=45 * 2**30)  # the generation
        logs.note_device_used("gen")
        device["free"] = 90 * 2**30
        logs.note_device_used("gen")
        device["free"] = 120 * 2**30
        logs.note_device_used("gen")
        logs.end_phase_peak("gen")  # the H200's 7B run measured the reload below as its generation's peak
        allocated.update(now=125 * 2**30, peak=125 * 2**30)  # the state reloaded, still inside the timer
    assert logs.take_phase_peaks() == {"gen": 45 * 2**30} and logs.RUN_PEAK[0] == 120 * 2**30
    assert logs.take_device_used() == {"gen": 50 * 2**30} and logs.take_device_used() == {}
    with logs.timer("gen", {}):  # the next phase counts again, and the run's peak has the reload
        allocated.update(peak=130 * 2**30)
    assert logs.take_phase_peaks() == {"gen": 130 * 2**30} and logs.RUN_PEAK[0] == 130 * 2**30
    logs.RUN_PEAK[0] = saved
