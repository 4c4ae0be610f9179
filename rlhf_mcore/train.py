"""Entry point: `python -m rlhf_mcore.train --config CFG [a.b=value ...]`, started by torchrun on every rank.

`--validate-only` prints the resolved config (exit 0) or every error (exit 2) and builds nothing.
Exit codes: 0 done, 2 a problem found before the model is built (config, paths, data, rewards, a locked
output directory), 3 training diverged, 4 the rewards keep failing, 5 a collective timed out, 6 the disk is
full, 7 stopped by SIGTERM/SIGINT after saving the step's checkpoint, 8 a second SIGTERM/SIGINT: exited at once
without saving (`rlhf_mcore.trainer.guards`, `rlhf_mcore.trainer.signals`); 1 an uncaught error, or a checkpoint
writer process that died mid-save (`rlhf_mcore.checkpoint.writers`). Only rank 0 prints the problems; every rank
exits with the same code.

The output directory (`rlhf_mcore.checkpoint.run_identity`): `trainer.resume=auto` (default) continues the run that
`latest` names from its newest intact checkpoint; step directories or `latest` with no intact checkpoint exit 2,
listing the damage. `trainer.resume=disable` starts fresh, and exits 2 in a directory that already holds a run;
`trainer.resume=restart` moves that run aside to `restarted-<time>/` and starts over; `trainer.resume=<path>` a
given checkpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from rlhf_mcore.config.load import ConfigError, dump_yaml, load_config
from rlhf_mcore.trainer.guards import (
    EXIT_DISK_FULL,
    EXIT_STARTUP,
    RunStopped,
    collective_timeout_error,
    is_collective_timeout,
)

# torchrun's pid: rlhf_mcore.launcher passes it on (a launcher killed before this interpreter started is noticed
# too); under a bare torchrun, the parent's, read before the slow imports
LAUNCHER_PID = int(os.environ.get("RLHF_MCORE_LAUNCHER_PID") or os.getppid())


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None,
                        help="YAML experiment config (see configs/); without it the defaults plus the overrides run")
    parser.add_argument("--validate-only", action="store_true", help="check the config, print it, build nothing")
    parser.add_argument("--config-path", default=None, help="Hydra's (verl's scripts): the folder of --config-name")
    parser.add_argument("--config-name", default=None, help="Hydra's: the config's name in --config-path (.yaml)")
    parser.add_argument("overrides", nargs="*",
                        help="a.b=value overrides of existing keys (verl's keys too: docs/verl.md); "
                             "Hydra's +a.b=value and ~a.b are taken too")
    args = parser.parse_intermixed_args(argv)  # flags may follow overrides (the launch scripts put them last)
    args.verl_trainer_config = None
    if args.config_name:  # verl's `--config-path=DIR --config-name=NAME`
        name = args.config_name if args.config_name.endswith((".yaml", ".yml")) else f"{args.config_name}.yaml"
        path = os.path.join(args.config_path or ".", name)
        if not args.config and not os.path.exists(path) and name[:-5] in VERL_TRAINER_CONFIGS:
            args.verl_trainer_config = name[:-5]  # verl's own trainer config, the base of its example scripts
        else:
            args.config = args.config or path
    return args


# verl's own trainer configs (its scripts start from them with --config-path=config --config-name=NAME): not files
# here; our defaults are verl's, so a run starts from ours
VERL_TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")


def report(lines: list[str], rank: int, header: str) -> None:
    """Rank 0 prints the lines (problems, notes), one per line, once for the whole job (no traceback)."""
    if rank == 0 and lines:
        print("\n".join([header, *(f"  - {line}" for line in lines)]), file=sys.stderr, flush=True)


def main(argv=None, body=None) -> int:
    """The run's start-up and exit codes around `body(cfg)` (default: `train`; `rlhf_mcore.evaluate` passes its own)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from rlhf_mcore.lifetime import die_with_parent, forked_children_die_with_us

    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank: die with torchrun, from here on (the torch import is slow)
        die_with_parent()
        if os.getppid() != LAUNCHER_PID:  # it died before the signal was set
            return 1
    from rlhf_mcore.parallel import exit_with_launcher, torchrun_env  # imports torch: after --help has exited

    rank, _, world_size = torchrun_env()
    notes: list[str] = []
    if args.verl_trainer_config:
        notes.append(f"--config-name={args.verl_trainer_config}: verl's own trainer config (no such file here); the "
                     "run starts from our defaults, which follow verl's, and the overrides (docs/verl.md)")
    try:
        cfg = load_config(args.config, args.overrides, world_size=None if args.validate_only else world_size,
                          notes=notes)
    except ConfigError as e:
        report(notes, rank, "config notes:")
        report(e.errors, rank, "invalid config:")
        return EXIT_STARTUP
    report(notes, rank, "config notes:")
    if args.validate_only:
        from rlhf_mcore.trainer.preflight import static_errors

        problems, _ = static_errors(cfg)  # paths, tokenizer, data files: what needs no process group or model
        report(problems, rank, "cannot start:")
        if problems:
            return EXIT_STARTUP
        print(dump_yaml(cfg), end="")
        from rlhf_mcore.plan.phases import plan_line

        print(f"# {plan_line(cfg, world_size)}")  # a YAML comment: the output stays the config
        return 0
    exit_with_launcher(LAUNCHER_PID)
    forked_children_die_with_us()  # megatron's checkpoint writers (and so the resource tracker) die with the rank
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(run_training)(cfg, rank, body)  # an uncaught error's traceback: in torchrun's summary, by rank


def run_training(cfg, rank: int, body=None) -> int:
    """train(cfg) (or `body(cfg)`), with each deliberate stop turned into its message and exit code
    (rlhf_mcore.trainer.guards)."""
    import torch.distributed

    from rlhf_mcore.parallel import PortInUse, destroy_distributed
    from rlhf_mcore.trainer.loop import train

    owned = not torch.distributed.is_initialized()  # the groups this run creates are its own to tear down
    try:
        (body or train)(cfg)
    except PortInUse as e:
        report([str(e)], rank, "cannot start:")
        return EXIT_STARTUP
    except RunStopped as e:
        report(e.lines, rank, "cannot start:" if e.exit_code == EXIT_STARTUP else "run stopped:")
        if owned:  # every rank stops at the same point (guards.py): leave together, as at the end of a run;
            with contextlib.suppress(Exception):  # a rank that never arrives times the barrier out: exit anyway
                destroy_distributed()
        return e.exit_code
    except Exception as e:
        from rlhf_mcore.disk import disk_full_message, is_disk_full

        if is_disk_full(e):  # metrics, TensorBoard, checkpoints, exports: wherever the disk filled up
            line = disk_full_message(e, cfg.trainer.output_dir) or str(e).splitlines()[0]
            print(f"{'' if rank == 0 else f'[rank{rank}] '}run stopped: {line}", file=sys.stderr, flush=True)
            return EXIT_DISK_FULL
        if not is_collective_timeout(e):
            raise
        stop = collective_timeout_error(e, cfg.parallel.collective_timeout_min)
        print(f"[rank{rank}] run stopped: {stop}", file=sys.stderr, flush=True)  # every rank: which one waited
        return stop.exit_code
    if owned:
        destroy_distributed()  # a clean gloo/NCCL shutdown: exiting with live groups can abort a rank
    return 0


if __name__ == "__main__":
    sys.exit(main())
