"""`python -m rlhf_mcore.plan --config CFG [a.b=value ...] [--gpus N] [--gpu-memory GiB]`: the static memory of
every valid layout of N GPUs, per rank and role, best first (the most data parallelism that fits).

Static terms only (`rlhf_mcore.plan.static`): weights, gradients and optimizer state, exact for the parameters.
Activations, the KV cache and the rollout engine's copy come on top and are not in this plan yet.
"""
from __future__ import annotations

import argparse
import sys

from rlhf_mcore.plan.params import Shape
from rlhf_mcore.plan.static import Layout, layouts, peak_bytes, roles_of, stage_bytes

GIB = 2**30


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m rlhf_mcore.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="a YAML config (default: the defaults)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs in all (default: the config's layout, one DP rank)")
    p.add_argument("--gpu-memory", type=float, default=0.0, help="GiB a GPU has (default: unknown: no fit column)")
    return p.parse_known_args(argv)


def rows(cfg, shape: Shape, gpus: int, gpu_bytes: float) -> list[tuple[Layout, int, bool]]:
    """(layout, peak static bytes per rank, fits) for every valid layout, best first."""
    roles, found = roles_of(cfg), []
    for layout in layouts(shape, gpus):
        peak = peak_bytes(shape, layout, roles, cfg.model.dtype, cfg.parallel.use_distributed_optimizer,
                          cfg.model.make_vocab_size_divisible_by)
        found.append((layout, peak, not gpu_bytes or peak <= gpu_bytes))
    return sorted(found, key=lambda r: (not r[2], r[0].tp * r[0].pp, r[1]))  # fits, least model parallelism, headroom


def main(argv=None) -> int:
    from rlhf_mcore.config.load import ConfigError, load_config

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    from rlhf_mcore.models.transformer_config import load_hf_config

    try:  # types and names only: a plan needs the model, not the data or the reward files
        cfg = load_config(args.config, overrides, check=False)
        shape = Shape.of(load_hf_config(cfg.model))
    except (ConfigError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    p = cfg.parallel
    gpus = args.gpus or p.tp * p.pp
    found = rows(cfg, shape, gpus, args.gpu_memory * GIB)
    roles = ", ".join(r.name for r in roles_of(cfg))
    print(f"memory plan: {gpus} GPU(s){f' of {args.gpu_memory:g} GiB' if args.gpu_memory else ''}, "
          f"{cfg.model.dtype}, roles {roles}, distributed optimizer {'on' if p.use_distributed_optimizer else 'off'}")
    print("static terms per rank (weights + gradients + optimizer state); activations, KV cache and the rollout "
          "engine come on top")
    for layout, peak, fits in found:
        print(f"  {str(layout):<24} {peak / GIB:9.2f} GiB  {'fits' if fits else 'does not fit'}")
    if not found:
        print(f"  no valid layout of {gpus} GPU(s) for this model")
        return 1
    best = found[0][0]
    print(f"per role at {best} (first pipeline stage):")
    for name, terms in stage_bytes(shape, best, 0, roles_of(cfg), cfg.model.dtype,
                                   p.use_distributed_optimizer, cfg.model.make_vocab_size_divisible_by).items():
        print(f"  {name:<7} " + "  ".join(f"{k} {v / GIB:.2f} GiB" for k, v in terms.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
