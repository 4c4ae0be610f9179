"""The top-level kernels/ folder is imported as `rlhf_mcore.kernels`, never as `kernels` (a PyPI name)."""
import importlib.util
from pathlib import Path

import rlhf_mcore.kernels.fused_logprob as fused_logprob

from tests.launch import cli
from tests.support.paths import ROOT


def test_kernels_folder_is_rlhf_mcore_kernels():
    assert Path(fused_logprob.__file__).resolve() == ROOT / "kernels" / "fused_logprob.py"
    assert not (ROOT / "kernels" / "__init__.py").exists()  # not a top-level package of its own


def test_top_level_kernels_is_not_ours_from_the_source_tree():
    """Run from the checkout with PYTHONPATH=<checkout> (how GPU scripts run): `kernels` is not our folder."""
    code = ("import importlib.util; s = importlib.util.find_spec('kernels'); "  # a PyPI `kernels` may be installed
            "print(s is not None and %r in (s.submodule_search_locations or []))" % str(ROOT / "kernels"))
    out = cli("-c", code)
    assert out.stdout.strip() == "False"
    assert importlib.util.find_spec("rlhf_mcore.kernels.fused_logprob").origin == str(ROOT / "kernels" /
                                                                                     "fused_logprob.py")
