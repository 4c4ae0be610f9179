"""`rlhf_mcore.kernels`: the import name of the repository's top-level `kernels/` folder (one Triton kernel per
file, each next to its pure-torch reference), e.g. `from rlhf_mcore.kernels.fused_logprob import ...`.

The folder keeps its place in the layout but is not a top-level package of its own (it has no `__init__.py`), so
it never collides with the PyPI distribution `kernels`. This module points its package path at the folder: in a
source tree (the editable install of `make venv`, `PYTHONPATH=<checkout>`) that is `<checkout>/kernels`; an
installed wheel carries the same files as `rlhf_mcore/kernels/` (setup.py's `package_dir`).
"""
from pathlib import Path

_installed = Path(__file__).resolve().parent / "kernels"  # a wheel's copy; absent in a source tree
__path__ = [str(_installed if _installed.is_dir() else _installed.parent.parent / "kernels")]
