"""Entry point: `python -m rlhf_mcore.train --config CFG [a.b=value ...]`, started by torchrun on every rank.

`--validate-only` prints the resolved config (exit 0) or every error (exit 2) and builds nothing.
"""
from __future__ import annotations

import argparse
import sys

from rlhf_mcore.config_load import ConfigError, dump_yaml, load_config
from rlhf_mcore.parallel import torchrun_env


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML experiment config (see configs/)")
    parser.add_argument("--validate-only", action="store_true", help="check the config, print it, build nothing")
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides of existing keys")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _, _, world_size = torchrun_env()
    try:
        cfg = load_config(args.config, args.overrides, world_size=None if args.validate_only else world_size)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.validate_only:
        print(dump_yaml(cfg), end="")
        return 0
    from rlhf_mcore.parallel import destroy_distributed
    from rlhf_mcore.trainer import train

    train(cfg)
    destroy_distributed()  # a clean gloo/NCCL shutdown: exiting with live groups can abort a rank
    return 0


if __name__ == "__main__":
    sys.exit(main())
