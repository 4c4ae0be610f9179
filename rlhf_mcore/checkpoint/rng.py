"""Every RNG a rank draws from, as one tensor-only dict (loadable with torch.load(weights_only=True)):
Python `random`, numpy, torch CPU, CUDA (when present) and megatron's model-parallel RNG tracker."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch


def capture_rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "megatron": _tracker_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(_as_python_state(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    if state["megatron"]:
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(dict(state["megatron"]))


def save_rng_file(path: Path) -> None:
    torch.save(capture_rng_state(), path)


def load_rng_file(path: Path) -> None:
    restore_rng_state(torch.load(path, weights_only=True))


def _tracker_states() -> dict:
    """Megatron's named CUDA RNG states (empty on CPU, where the inference tracker keeps none)."""
    from megatron.core import tensor_parallel

    return {k: v.clone() for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()}


def _as_python_state(value):
    """random.setstate wants tuples; torch.load gives back what torch.save got, lists included."""
    version, internal, gauss = value
    return version, tuple(internal), gauss
