"""trainer.profile_steps (rlhf_mcore/trainer/profiler.py): only the named steps are profiled; each gets a
per-phase summary whose walls are the phases' timers (logs.timer marks them), and an operator table."""
import json
import time
import types

import torch

from rlhf_mcore.logs import timer
from rlhf_mcore.trainer.profiler import phase_summary, profile_step


def run_step(cfg, step: int) -> dict:
    timings = {}
    with profile_step(cfg, step, rank=0):
        with timer("fwd", timings):
            torch.randn(256, 256) @ torch.randn(256, 256)
        with timer("sleepy", timings):
            time.sleep(0.05)
    return timings


def test_only_named_steps_are_profiled_and_phases_match_their_timers(tmp_path):
    cfg = types.SimpleNamespace(profile_steps=[2], profile_trace=True, output_dir=str(tmp_path))
    run_step(cfg, 1)
    assert not (tmp_path / "profile").exists()
    timings = run_step(cfg, 2)
    folder = tmp_path / "profile"
    summary = json.loads((folder / "step_2.json").read_text())
    assert set(summary) == {"fwd", "sleepy"}
    assert abs(summary["sleepy"]["wall_s"] - timings["sleepy"]) < 0.01
    assert summary["sleepy"]["wall_s"] >= 0.05 and summary["fwd"]["wall_s"] > 0
    if not torch.cuda.is_available():
        assert all(s["launches"] == 0 and s["device_busy_s"] == 0 for s in summary.values())
    assert "aten::mm" in (folder / "step_2.txt").read_text()
    assert (folder / "step_2.trace.json.gz").stat().st_size > 0


def test_profile_steps_are_checked():
    from rlhf_mcore.config.load import ConfigError, load_config

    try:
        load_config("configs/tiny_grpo.yaml", ["trainer.profile_steps=[0,3]"])
    except ConfigError as e:
        assert "trainer.profile_steps" in str(e) and "0" in str(e)
    else:
        raise AssertionError("trainer.profile_steps=[0] passed validation")


def test_phase_summary_of_no_events_is_empty():
    assert phase_summary([]) == {}
