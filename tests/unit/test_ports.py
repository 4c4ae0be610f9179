"""Rendezvous ports come from below the kernel's ephemeral range (rlhf_mcore/ports.py): a port the kernel hands out
could be taken by another test's gloo connection before the run binds it (a CI run failed with EADDRINUSE so)."""
import socket

from rlhf_mcore.ports import LOWEST, ephemeral_low, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable(tmp_path):
    low = ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_low(str(tmp_path / "range")) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
