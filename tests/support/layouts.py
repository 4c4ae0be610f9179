"""Layouts in tests: the shipped `tools.check_layouts` through the launcher and its table (tests/dist/layouts/), and
the `--work --layouts --cases` command line of the cases that loop over layouts (tests/cases/)."""
import argparse
from pathlib import Path

from tests.launch import cli, torchrun
from tests.support.paths import CONFIGS


def check_layouts(nproc: int, layouts: str, *args: str, config: str = "tiny_grpo.yaml"):
    """`tools.check_layouts --config configs/<config> --layouts <layouts> <args>` under torchrun (nproc > 0), or
    as one plain process (nproc 0: its own exit code, world size 1). Not checked: the tests read the exit code."""
    argv = ("--config", CONFIGS / config, "--layouts", layouts, *args)
    one_thread = {"OMP_NUM_THREADS": "1"}
    if nproc:
        return torchrun("tools.check_layouts", nproc, *argv, check=False, extra_env=one_thread)
    return cli("tools.check_layouts", *argv, check=False, extra_env=one_thread)


def parse_table(stdout: str) -> list[list[str]]:
    lines = stdout[stdout.index("layout"):].splitlines()[1:]
    return [line.split() for line in lines if line.startswith("tp")]


def parse_work_layouts_cases(argv: list[str]) -> argparse.Namespace:
    """--work DIR --layouts TPxPP[xEP],... --cases a,b: what convert_layouts and hf_load take."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--layouts", required=True, help="comma-separated TPxPP[xEP], e.g. 1x1,2x1,1x2,1x1x2")
    parser.add_argument("--cases", required=True)
    return parser.parse_args(argv)


def split_layouts(spec: str) -> list[tuple[int, int, int]]:
    """"1x1,2x1,1x1x2" -> [(1, 1, 1), (2, 1, 1), (1, 1, 2)] (tp, pp, ep)."""
    return [(*(int(x) for x in layout.split("x")), 1)[:3] for layout in spec.split(",")]


def each_layout(argv: list[str]):
    """The cases' loop over layouts: parse `--work --layouts --cases`, and per layout reset model parallelism and
    initialise it; yields (args, layout label "TPxPP[xEP]", ctx). Process groups are destroyed at the end."""
    from rlhf_mcore.logs import init_logger
    from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env

    args = parse_work_layouts_cases(argv)
    init_logger(torchrun_env()[0])
    for tp, pp, ep in split_layouts(args.layouts):
        reset_model_parallel()
        yield args, f"{tp}x{pp}" + (f"x{ep}" if ep > 1 else ""), init_distributed(tp, pp, ep=ep)
    destroy_distributed()
