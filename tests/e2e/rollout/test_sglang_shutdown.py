"""Shutting an SGLang engine down spares multiprocessing's resource tracker (tests/cases/sglang_shutdown.py)."""
import pytest

from tests.launch import worker


@pytest.mark.parametrize("shutdown", ["sglang", "ours"])
def test_shutdown_spares_the_resource_tracker(shutdown):
    """sglang.Engine.shutdown kills every child of this process, multiprocessing's resource tracker too; the
    next release of a named semaphore or shared-memory block relaunches a tracker that prints a KeyError
    traceback (the SGLang benchmark's last lines; reproduced by `sglang`). Ours spares the tracker: the
    engine's processes stop, nothing is printed, also when shutdown is called twice."""
    proc = worker(0, ("sglang_shutdown", shutdown), check=False, timeout=300)
    assert proc.returncode == 0 and "scheduler stopped: True" in proc.stdout, proc.stdout + proc.stderr
    if shutdown == "sglang":
        assert "process died unexpectedly" in proc.stderr and "KeyError" in proc.stderr, proc.stderr
    else:
        assert "Traceback" not in proc.stderr and "resource_tracker" not in proc.stderr, proc.stderr
