"""`python -m rlhf_mcore.plan --config CFG [a.b=value ...] [--gpus N] [--gpu-memory GiB]`: the peak memory per rank
of every valid layout of N GPUs, best first (the most data parallelism that fits), and the phases of the best.

The resident terms (`plan.static`: weights, gradients, optimizer state) are exact for the parameters; each phase's
own terms (`plan.phases`: KV cache, activations, log-prob buffers) are formulas in the model's shapes. A layout fits
when its peak leaves `MARGIN` of the device free (the CUDA context and the allocator's fragmentation).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable

from rlhf_mcore.plan.params import Shape, experts_per_token
from rlhf_mcore.plan.phases import MARGIN, as_engine_runs, phase_terms, rank_peak
from rlhf_mcore.plan.static import Layout, layouts, roles_of

GIB = 2**30


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m rlhf_mcore.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="a YAML config (default: the defaults)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs in all (default: the config's layout, one DP rank)")
    p.add_argument("--gpu-memory", type=float, default=0.0, help="GiB a GPU has (default: unknown: no fit column)")
    return p.parse_known_args(argv)


def family_allows(cfg, hf: dict) -> Callable[[Layout], bool]:
    """Whether the model's family and the config's rollout engine run at a layout: the family's `run_errors` and
    `stage_errors` and the engine's `layout_errors` there add nothing to the config's own at 1 x 1 x 1 (Qwen3-VL-MoE
    trains at tp 1; Qwen3-VL's DeepStack layers stay on the first stage; an MoE model at tp > 1 trains with
    sequence parallelism, which the native engine cannot decode with)."""
    from rlhf_mcore.models.registry import spec_for_hf_config
    from rlhf_mcore.models.spec import num_experts
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    spec = spec_for_hf_config(hf)
    flat = spec.text_config(hf)
    engine = ROLLOUT_ENGINES.get(cfg.rollout.engine) if cfg.rollout.engine in ROLLOUT_ENGINES else None

    def errors(tp: int, pp: int, ep: int) -> set[str]:
        sp = tp > 1 and (cfg.parallel.sequence_parallel or bool(num_experts(flat)))  # MoE at tp > 1 needs it
        parallel = dataclasses.replace(cfg.parallel, tp=tp, pp=pp, ep=ep, sequence_parallel=sp)
        run = spec.run_errors(dataclasses.replace(cfg, parallel=parallel))
        return set(run) | set(spec.stage_errors(flat, parallel)) | set(engine.layout_errors(parallel) if engine else ())

    base = errors(1, 1, 1)
    return lambda layout: not errors(layout.tp, layout.pp, layout.ep) - base


def rows(cfg, shape: Shape, gpus: int, gpu_bytes: float, experts_per_token: int = 1,
         allowed: Callable[[Layout], bool] = lambda layout: True) -> list[tuple[Layout, str, int, bool]]:
    """(layout, peak phase, its bytes per rank, fits) for every valid layout the family allows, best first."""
    found = []
    for layout in filter(allowed, layouts(shape, gpus)):
        phase, peak, _ = rank_peak(cfg, shape, layout, gpu_bytes, experts_per_token)
        found.append((layout, phase, peak, not gpu_bytes or peak <= gpu_bytes * (1 - MARGIN)))
    return sorted(found, key=lambda r: (not r[3], r[0].tp * r[0].pp, r[2]))  # fits, least model parallelism, headroom


def offload_hint(cfg, shape: Shape, gpus: int, gpu_bytes: float, top_k: int,
                 allowed: Callable[[Layout], bool]) -> str:
    """What to change when no layout fits: the best layout with the optimizer states on the host during the rollout
    (`trainer.offload_during_rollout`) where one then fits; else more GPUs or a smaller batch."""
    if not cfg.trainer.offload_during_rollout:
        offloaded = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, offload_during_rollout=True))
        layout, phase, peak, fits = rows(offloaded, shape, gpus, gpu_bytes, top_k, allowed)[0]
        if fits:
            return (f"  no layout fits; with trainer.offload_during_rollout=true (Adam's state on the host while the "
                    f"rollout runs) {layout} peaks at {peak / GIB:.2f} GiB ({phase}) and fits")
    return f"  no layout fits {gpus} GPU(s) of {gpu_bytes / GIB:g} GiB: plan more GPUs (--gpus) or a smaller batch"


def main(argv=None) -> int:
    from rlhf_mcore.config.load import ConfigError, load_config

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    from rlhf_mcore.models.transformer_config import load_hf_config

    try:  # types and names only: a plan needs the model, not the data or the reward files
        cfg = load_config(args.config, overrides, check=False)
        hf = load_hf_config(cfg.model)
        shape = Shape.of(hf)
    except (ConfigError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    p = cfg.parallel
    gpus = args.gpus or p.tp * p.pp
    gpu_bytes = args.gpu_memory * GIB
    top_k = experts_per_token(hf)
    cfg, released = as_engine_runs(cfg, gpu_bytes, gpus) if gpu_bytes else (cfg, "")  # as on this device
    found = rows(cfg, shape, gpus, gpu_bytes, top_k, family_allows(cfg, hf))
    roles = ", ".join(r.name for r in roles_of(cfg))
    print(f"memory plan: {gpus} GPU(s){f' of {args.gpu_memory:g} GiB' if args.gpu_memory else ''}, "
          f"{cfg.model.dtype}, roles {roles}, rollout {cfg.rollout.engine}, distributed optimizer "
          f"{'on' if p.use_distributed_optimizer else 'off'}, recompute {cfg.model.recompute}")
    print(f"peak per rank (its phase); fits = leaves {MARGIN:.0%} of the device free" if gpu_bytes else
          "peak per rank (its phase); pass --gpu-memory GiB to see which layouts fit")
    if released:
        print(f"  rollout.native.keep_graphs: {released}, so the engine frees it after each rollout (planned so)")
    for layout, phase, peak, fits in found:
        verdict = ("fits" if fits else "does not fit") if gpu_bytes else ""
        print(f"  {str(layout):<24} {peak / GIB:9.2f} GiB  {phase:<9} {verdict}".rstrip())
    if not found:
        print(f"  no valid layout of {gpus} GPU(s) for this model")
        return 1
    if gpu_bytes and not found[0][3]:
        print(offload_hint(cfg, shape, gpus, gpu_bytes, top_k, family_allows(cfg, hf)))
    best = found[0][0]
    print(f"phases at {best} (first pipeline stage):")
    for phase, terms in phase_terms(cfg, shape, best, gpu_bytes, 0, top_k).items():
        print(f"  {phase:<9} {sum(terms.values()) / GIB:8.2f} GiB = " + " + ".join(
            f"{k} {v / GIB:.2f}" for k, v in terms.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
