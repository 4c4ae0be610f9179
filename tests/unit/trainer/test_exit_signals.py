"""The exit-signal rule of rlhf_mcore/trainer/signals.py, in-process: a second signal within the repeat window is
the same stop (Slurm signals every rank and torchrun passes its own on), after it a forced exit without saving."""
import signal

import pytest

from rlhf_mcore.trainer import signals
from rlhf_mcore.trainer.guards import EXIT_SIGNAL, EXIT_SIGNAL_FORCED


class Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch):
    codes = []

    def fake_exit(code):
        codes.append(code)
        raise Exited(code)

    monkeypatch.setattr(signals.ExitSignals, "_exit", staticmethod(fake_exit))
    return codes


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: now[0])
    return now


def test_a_signal_before_training_exits_at_once(exits):
    s = signals.ExitSignals(rank=0, repeat_window_s=5.0)
    with pytest.raises(Exited):
        s._on_signal(signal.SIGTERM)
    assert exits == [EXIT_SIGNAL]


def test_a_second_signal_within_the_window_is_the_same_stop(exits, clock, caplog):
    s = signals.ExitSignals(rank=1, repeat_window_s=5.0)
    s.arm()
    s._on_signal(signal.SIGTERM)
    clock[0] += 4.9
    s._on_signal(signal.SIGTERM)
    assert s.received == signal.SIGTERM and exits == []
    assert "the same stop" in caplog.text


def test_a_second_signal_after_the_window_exits_without_saving(exits, clock):
    s = signals.ExitSignals(rank=0, repeat_window_s=5.0)
    s.arm()
    s._on_signal(signal.SIGINT)
    clock[0] += 5.1
    with pytest.raises(Exited):
        s._on_signal(signal.SIGINT)
    assert exits == [EXIT_SIGNAL_FORCED]


def test_no_window_means_every_second_signal_forces_the_exit(exits, clock):
    s = signals.ExitSignals(rank=0, repeat_window_s=0.0)
    s.arm()
    s._on_signal(signal.SIGTERM)
    with pytest.raises(Exited):
        s._on_signal(signal.SIGTERM)
    assert exits == [EXIT_SIGNAL_FORCED]
