"""Free TCP ports for a rendezvous, chosen below the kernel's ephemeral range.

A port the kernel hands out (a bind to port 0, or the local end of any outgoing connection, such as gloo's many)
can be handed out again between our check and the rendezvous's own bind: a run then fails with EADDRINUSE. A port
below that range is only ever taken by a process that chooses it as we do, at random.
"""
from __future__ import annotations

import random
import socket

LOWEST = 15000


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody holds now, from [LOWEST, the ephemeral range); the kernel's choice if none
    of 100 random tries is free."""
    high = ephemeral_low() - 1
    rng = random.Random()  # its own seed from the OS: two processes seeded alike must not pick alike
    for _ in range(100 if high > LOWEST else 0):
        port = rng.randint(LOWEST, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
