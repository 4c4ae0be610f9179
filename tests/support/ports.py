"""Ports for rendezvous in tests: rlhf_mcore.ports (below the kernel's ephemeral range, so that gloo's own
connections in other tests cannot take a port between its choice and its bind)."""
from rlhf_mcore.ports import free_port

__all__ = ["free_port"]
