"""The layout checks of tests/dist/layouts/: the shipped `tools.check_layouts` through the launcher, and its table."""
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
