"""`rlhf_mcore.kernels`: the import name of the repository's top-level `kernels/` folder (one Triton kernel per
file, each next to its pure-torch reference), e.g. `from rlhf_mcore.kernels.fused_logprob import ...`.

The folder keeps its place in the layout but is not a top-level package of its own (it has no `__init__.py`), so
it never collides with the PyPI distribution `kernels`. This module points its package path at the folder:
that works wherever the package is used from its source tree (the editable install of `make venv`, and
`PYTHONPATH=<checkout>` on a GPU box or in a worktree).
"""
from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent.parent / "kernels")]
