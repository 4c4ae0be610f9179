"""One run per output directory: a live run's directory is refused (nothing in it touched); the lock of a
killed run is taken over with a warning."""
import os
import signal

from rlhf_mcore.train import run_training
from rlhf_mcore.trainer.lock import LOCK_FILE, RunLock
from tests.launch import cli
from tests.support.reliability import tiny_cfg


def test_second_run_on_a_live_directory_is_refused(tmp_path, mcore_ctx, capsys):
    run_dir = tmp_path / "run"
    in_progress = run_dir / "global_step_5.tmp-0123abcd"  # the live run's save in progress
    in_progress.mkdir(parents=True)
    with RunLock(run_dir):
        assert run_training(tiny_cfg(tmp_path), rank=0) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0] == "cannot start:" and len(lines) == 2 and "Traceback" not in err
    assert lines[1].startswith(f"  - trainer.output_dir: {run_dir} is in use by another run (pid {os.getpid()} on "
                               "host ")
    assert in_progress.is_dir() and not (run_dir / "config.yaml").exists()


def test_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    code = f"from rlhf_mcore.trainer.lock import RunLock; RunLock({str(tmp_path)!r}).acquire(); import os; " \
           "print(os.getpid(), flush=True); os.kill(os.getpid(), 9)"
    proc = cli("-c", code, check=False)
    assert proc.returncode == -signal.SIGKILL
    dead_pid = int(proc.stdout)
    with caplog.at_level("WARNING"), RunLock(tmp_path):
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    assert f"taking over the lock of a run that is gone (pid {dead_pid} on host" in caplog.text
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_a_restarted_attempt_waits_for_the_killed_attempts_children_to_let_go(tmp_path, monkeypatch):
    """A forked child (megatron's checkpoint writer) shares the killed rank's lock file: the restarted attempt
    (TORCHELASTIC_RESTART_COUNT > 0) waits for it, a first attempt is refused at once."""
    import pytest

    from rlhf_mcore.trainer.lock import RunDirLocked

    code = f"from rlhf_mcore.trainer.lock import RunLock; RunLock({str(tmp_path)!r}).acquire(); import os, time\n" \
           "if os.fork() == 0:\n    os.close(1); os.close(2); time.sleep(2.0); os._exit(0)\n" \
           "print('forked', flush=True); os.kill(os.getpid(), 9)"
    proc = cli("-c", code, check=False)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "forked\n"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(RunDirLocked):
        RunLock(tmp_path).acquire()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with RunLock(tmp_path):
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
