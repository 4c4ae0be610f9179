"""Each deliberate stop reaches the shell as its own exit code with one message, printed by rank 0 only."""
import pytest

import rlhf_mcore.trainer.loop as trainer_mod
from rlhf_mcore.train import run_training
from rlhf_mcore.trainer.guards import CollectiveTimeoutError, DivergedError, RewardHealthError, StartupError
from tests.support.reliability import tiny_cfg


@pytest.mark.parametrize("error,code,header", [(StartupError("a: b"), 2, "cannot start:"),
                                               (DivergedError("a: b"), 3, "run stopped:"),
                                               (RewardHealthError("a: b"), 4, "run stopped:")])
def test_guard_errors_become_exit_codes(tmp_path, monkeypatch, capsys, error, code, header):
    def fail(cfg):
        raise error

    monkeypatch.setattr(trainer_mod, "train", fail)
    cfg = tiny_cfg(tmp_path)
    assert run_training(cfg, rank=0) == code
    assert capsys.readouterr().err == f"{header}\n  - a: b\n"
    assert run_training(cfg, rank=1) == code
    assert capsys.readouterr().err == ""


def test_a_gloo_timeout_becomes_exit_code_5_naming_the_key(tmp_path, monkeypatch, capsys):
    def fail(cfg):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 18000ms "
                           "for recv operation to complete")

    monkeypatch.setattr(trainer_mod, "train", fail)
    assert run_training(tiny_cfg(tmp_path, "parallel.collective_timeout_min=0.3"), rank=1) == 5
    err = capsys.readouterr().err
    assert err.startswith("[rank1] run stopped: a collective operation timed out after "
                          "parallel.collective_timeout_min=0.3 min (18 s)"), err
    assert CollectiveTimeoutError.exit_code == 5


def test_other_errors_keep_their_traceback(tmp_path, monkeypatch):
    def fail(cfg):
        raise KeyError("a bug")

    monkeypatch.setattr(trainer_mod, "train", fail)
    with pytest.raises(KeyError):
        run_training(tiny_cfg(tmp_path), rank=0)
