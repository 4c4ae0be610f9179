"""Process groups: the one module that talks to megatron's `parallel_state`.

Every rank runs the same program. `init_distributed()` reads torchrun's environment, creates the default
group (NCCL with CUDA, gloo without), initialises megatron's TP/PP/DP groups once, seeds every RNG, and
returns a `ParallelContext` that the rest of the code receives as an argument.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import threading
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from rlhf_mcore.config.schema import ep_fits
from rlhf_mcore.cpu_compat import apply_cpu_patches

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ParallelDims:
    """tp x pp x dp = world_size (cp is reserved and must be 1). ep (MoE experts) splits the tp x dp ranks of each
    pipeline stage: megatron's expert grid (whole experts, etp 1) is ep x (tp*dp/ep) expert-data-parallel copies,
    so an expert group may span TP ranks (slime's TP4 x EP8 on 8 GPUs: dp 2) as well as DP ranks."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @classmethod
    def from_world(cls, world_size: int, tp: int, pp: int, cp: int = 1, ep: int = 1) -> "ParallelDims":
        """DP fills whatever TP x PP x CP leaves of the world."""
        model_parallel = tp * pp * cp
        if tp < 1 or pp < 1 or cp < 1 or world_size % model_parallel:
            raise ValueError(
                f"parallel: tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel} must divide the world size "
                f"(got {world_size}). Choose tp and pp whose product divides the number of ranks."
            )
        if ep < 1 or not ep_fits(world_size, tp, pp, ep, cp):
            raise ValueError(f"parallel.ep: must divide tp*dp = world / pp = {world_size // (pp * cp)} (got {ep}). "
                             "Make the world size divisible by pp*ep.")
        return cls(tp=tp, pp=pp, dp=world_size // model_parallel, cp=cp, ep=ep)


@dataclasses.dataclass(frozen=True)
class ParallelContext:
    """What a rank needs to know about the layout: sizes, its ranks, and megatron's groups."""

    dims: ParallelDims
    rank: int
    local_rank: int
    device: torch.device
    pgs: object  # megatron.core.process_groups_config.ProcessGroupCollection
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.dims.pp - 1

    @property
    def is_logging_rank(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's variables; a plain `python` run is rank 0 of 1."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
    )


def seed_everything(seed: int) -> None:
    """Python, numpy, torch and megatron's model-parallel RNG tracker (same seed on every rank)."""
    from megatron.core import tensor_parallel

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # On CPU the default tracker calls torch.cuda.get_rng_state; the inference tracker does not.
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())


def exit_with_launcher(parent: int | None = None) -> bool:
    """Under torchrun: die with the launcher (the kernel sends SIGKILL when the parent exits), so a killed
    torchrun leaves no orphan ranks behind. Linux: prctl(PR_SET_PDEATHSIG); elsewhere a thread polls the
    parent pid. A plain `python` run is left alone (it may be meant to outlive its shell, e.g. under nohup).
    `parent`: the launcher's pid as recorded at start-up (a launcher killed before this call is then noticed).
    Returns whether the guard is on."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    parent = os.getppid() if parent is None else parent
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0:  # 1 = PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl failed")
    except (OSError, AttributeError):
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watchdog").start()
    if os.getppid() != parent:  # the launcher died before the guard was set
        os._exit(1)
    return True


def _watch_parent(parent: int, interval_s: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(interval_s)
    log.error("the launcher (pid %d) is gone: exiting", parent)
    os._exit(1)


class PortInUse(RuntimeError):
    """The rendezvous port this rank would listen on is taken (a one-line start-up error, exit 2)."""


def _init_default_group(rank: int, local_rank: int, world_size: int, timeout_min: float) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=timeout_min))
        except dist.DistNetworkError as e:
            if "EADDRINUSE" not in str(e):
                raise
            raise PortInUse(f"MASTER_PORT={os.environ['MASTER_PORT']} on {os.environ['MASTER_ADDR']} is in use by "
                            "another process (EADDRINUSE). Set MASTER_PORT to a free port, or launch with torchrun "
                            "--standalone (launch/torchrun.sh), which picks one.") from e
    return device


def init_distributed(tp: int = 1, pp: int = 1, seed: int = 1234, timeout_min: float = 10.0,
                     ep: int = 1) -> ParallelContext:
    """Create the default group and megatron's TP/PP/DP groups; seed all RNGs. Call once per process.
    timeout_min: how long any collective may wait for the other ranks (parallel.collective_timeout_min)."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    cpu_patched = apply_cpu_patches()
    rank, local_rank, world_size = torchrun_env()
    dims = ParallelDims.from_world(world_size, tp, pp, ep=ep)
    device = _init_default_group(rank, local_rank, world_size, timeout_min)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=dims.tp, pipeline_model_parallel_size=dims.pp,
            expert_model_parallel_size=dims.ep, expert_tensor_parallel_size=1,  # experts whole: parallel.etp=1
            distributed_timeout_minutes=timeout_min,
        )
    seed_everything(seed)
    log.info(
        "distributed: world=%d tp=%d pp=%d dp=%d ep=%d backend=%s%s", world_size, dims.tp, dims.pp, dims.dp, dims.ep,
        dist.get_backend(), " (CPU patches on)" if cpu_patched else "",
    )
    return ParallelContext(
        dims=dims, rank=rank, local_rank=local_rank, device=device,
        pgs=ProcessGroupCollection.use_mpu_process_groups(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
    )


def reset_model_parallel() -> None:
    """Drop megatron's TP/PP/DP groups (keeping the default group) so another layout can be initialised."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


def destroy_distributed() -> None:
    """Barrier, then tear down megatron's groups and the default group (ranks leave together)."""
    from megatron.core import parallel_state

    if dist.is_initialized():
        dist.barrier()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()

