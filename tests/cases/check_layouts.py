"""`check_layouts --config C --layouts L [...]`: the shipped tools/check_layouts.py, as a case, so that several
checks of one world size share a launch (tests/dist/layouts/test_layouts.py). Its CLI is tested there too."""
from tools.check_layouts import main


def entry(argv: list[str]) -> int:
    return main(argv)
