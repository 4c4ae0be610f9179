"""Ports for rendezvous in tests."""
import socket


def free_port() -> int:
    """A TCP port nobody listens on now (for torchrun's rendezvous in tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
