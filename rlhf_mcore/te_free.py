"""Patches megatron-core 0.16.1 needs wherever Transformer Engine is absent (CPU or GPU), in one place.

Applied by `apply_te_free_patches()` (models.build, before a model is built) only when transformer_engine is not
importable; with TE this module changes nothing. Each patch names its call site.
"""
from __future__ import annotations

import importlib.util


def apply_te_free_patches() -> list[str]:
    """Apply the patches; returns their names ([] with TE)."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return []
    from megatron.core.transformer.moe import moe_utils

    applied = []
    # T1: RouterGatingLinearFunction.forward / backward (moe_utils.py, router_gating_linear, called by
    # Router.gating) test `te_general_gemm is not None`, but the name is only bound when TE imports (fixed
    # upstream after 0.16.1): without it every MoE router raises NameError. None selects their torch.mm branch.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        applied.append("moe_utils.te_general_gemm")
    return applied
