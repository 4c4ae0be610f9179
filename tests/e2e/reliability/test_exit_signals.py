"""SIGINT mid-rollout, SIGTERM mid-update and mid-save (in process, one rank): the run stops after that step with exit
code 7 and a verified checkpoint of it, releases the run-directory lock, and a run resumed with resume=auto ends
with metrics equal, bitwise, to a run that was never interrupted. A second SIGTERM during the signal's save (a
subprocess) exits 8 at once, and the previous checkpoint still verifies and is still `latest`. The signal is sent
by the process to itself just before a named call (`signal_worker`), so each test hits its phase every time."""
import signal
import time

import pytest

import rlhf_mcore.trainer.loop as trainer_mod
from rlhf_mcore.checkpoint import list_checkpoints, save_load
from rlhf_mcore.checkpoint.layout import LATEST_FILE
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.guards import EXIT_SIGNAL, StoppedBySignal
from tests.cases.signal_fault import signal_before_call
from tests.launch import worker_cmd
from tests.support.ports import free_port
from tests.support.reliability import TIMING_KEYS, env, metrics, overrides_for, start, tiny_cfg, train_cmd, wait_for

# 2 optimizer steps per step (mini-batch 1 prompt of 2): "mid-update" falls between the two
SMALL = ("data.train_batch_size=2", "actor.ppo_mini_batch_size=1", "rollout.max_response_length=8",
         "data.val_files=", "trainer.total_steps=4")


def comparable(rows: list[dict]) -> dict:
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(TIMING_KEYS)} for m in rows}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, mcore_ctx):
    """Steps 1-4 of the uninterrupted run."""
    out = tmp_path_factory.mktemp("straight")
    trainer_mod.train(tiny_cfg(out, *SMALL))
    return comparable(metrics(out / "run"))


def interrupt_then_resume(tmp_path, monkeypatch, target, name: str, nth: int, signum, *overrides: str):
    """Run with `signum` sent before the nth call of target.name: the stop; then resume=auto to the end."""
    cfg = tiny_cfg(tmp_path, *SMALL, *overrides)
    monkeypatch.setattr(target, name, signal_before_call(getattr(target, name), nth, signum))
    with pytest.raises(StoppedBySignal) as stopped:
        trainer_mod.train(cfg)
    monkeypatch.undo()
    run_dir = tmp_path / "run"
    saved = [s for s, _ in list_checkpoints(run_dir)]
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
    assert (run_dir / "run.lock").read_text() == ""  # released (a clean exit empties the record)
    latest = int((run_dir / LATEST_FILE).read_text())
    resumed = trainer_mod.train(cfg)
    return stopped.value, saved, latest, resumed, comparable(metrics(run_dir))


@pytest.mark.parametrize("where, target, name, nth, signum, overrides, stop_step, saved", [
    ("mid-rollout", NativeRolloutEngine, "generate", 2, signal.SIGINT, (), 2, [2]),  # step 2's rollout (Ctrl-C)
    ("mid-update", phases, "optimizer_step", 3, signal.SIGTERM, (), 2, [2]),  # between step 2's optimizer steps
    ("mid-save", save_load, "_save_role", 1, signal.SIGTERM, ("trainer.save_freq=1",), 2, [1, 2]),  # step 1's save
])
def test_sigterm_saves_the_step_and_the_resumed_run_matches(tmp_path, monkeypatch, straight, capsys, where, target,
                                                             name, nth, signum, overrides, stop_step, saved):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # SIG_IGN under nohup or a runner
    stop, on_disk, latest, resumed, got = interrupt_then_resume(tmp_path, monkeypatch, target, name, nth, signum,
                                                                *overrides)
    out, sig = capsys.readouterr().out, signal.Signals(signum).name
    assert stop.exit_code == EXIT_SIGNAL == 7
    assert stop.lines[0].startswith(f"stopped at step {stop_step} by {sig} (received by rank 0): saved and "
                                    f"verified {tmp_path / 'run' / f'global_step_{stop_step}'}"), stop.lines
    assert f"received {sig}: finishing this step" in out and f"checkpoint {tmp_path / 'run'}" in out
    assert on_disk == saved and latest == stop_step, (where, on_disk, latest)
    assert resumed.start_step == stop_step
    assert sorted(got) == [1, 2, 3, 4] and got == straight, where  # bitwise: every logged value, every step
    # the handlers and the signal mask are put back as they were (default ones unless the runner ignores SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before and not signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_sigterm_with_save_on_signal_false_stops_without_saving(tmp_path, monkeypatch, straight):
    cfg = tiny_cfg(tmp_path, *SMALL, "trainer.save_on_signal=false")
    monkeypatch.setattr(phases, "optimizer_step", signal_before_call(phases.optimizer_step, 1))
    with pytest.raises(StoppedBySignal) as stopped:
        trainer_mod.train(cfg)
    assert "not saved (trainer.save_on_signal=false); there is no checkpoint" in stopped.value.lines[0]
    assert list_checkpoints(tmp_path / "run") == []


def test_a_second_sigterm_mid_save_exits_at_once_and_the_last_checkpoint_still_verifies(tmp_path, straight):
    run_dir = tmp_path / "run"
    spec = "rlhf_mcore.trainer.phases:optimizer_step:3,rlhf_mcore.checkpoint.save_load:_save_role:2"  # step 2
    cmd = worker_cmd("signal_fault", *train_cmd(*overrides_for(tmp_path, *SMALL, "trainer.save_freq=1",
                                                                "trainer.repeat_signal_window_s=0"))[3:])
    log = tmp_path / "run.log"
    proc = start(cmd, log, {**env(0, 1, free_port()), "SIGNAL_AT": spec})
    try:
        assert wait_for(lambda: "before call 2 of _save_role" in log.read_text(), 300, every_s=0.05), \
            log.read_text()[-3000:]
        second_sent = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - second_sent
    finally:
        proc.kill()
    out = log.read_text()
    assert rc == 8 and "second exit signal (SIGTERM): exiting now with code 8, without saving" in out, out[-3000:]
    assert took < 5, took  # at once: no step, no save, no collective to wait for
    print(f"second SIGTERM: exited {took:.2f}s after it was sent")
    assert [s for s, _ in list_checkpoints(run_dir)] == [1] and checkpoint_problems(run_dir / "global_step_1") == []
    assert (run_dir / LATEST_FILE).read_text().strip() == "1"
    assert list(run_dir.glob("global_step_2.tmp-*"))  # the save cut short: never published, removed at the next start
    resumed = trainer_mod.train(tiny_cfg(tmp_path, *SMALL, "trainer.save_freq=1"))
    assert resumed.start_step == 1 and comparable(metrics(run_dir)) == straight
    assert not list(run_dir.glob("global_step_*.tmp-*"))
