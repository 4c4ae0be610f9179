"""Patches megatron-core 0.16.1's MoE layer needs on our stack, in one place (a sibling of `cpu_compat`).

Applied by `apply_moe_patches()` (models.build, before an MoE model is built), once; each patch has its own
condition and names its call site:
- M1, only where transformer_engine is absent (CPU or GPU);
- M2, always: the installed torch (2.13) `all_to_all_single` binding refuses the numpy split sizes megatron passes.
`reduce_experts_over_expert_dp(model)` (M3) is per model: models.build calls it on each MoE model it builds.
"""
from __future__ import annotations

import importlib.util

_applied: list[str] | None = None


def _as_list(sizes):
    return sizes.tolist() if hasattr(sizes, "tolist") else sizes


def apply_moe_patches() -> list[str]:
    """Apply the patches this process needs; returns their names."""
    global _applied
    if _applied is not None:
        return _applied
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import moe_utils

    _applied = []
    # M1: RouterGatingLinearFunction.forward / backward (moe_utils.py, router_gating_linear, called by
    # Router.gating) test `te_general_gemm is not None`, but the name is only bound when TE imports (fixed
    # upstream after 0.16.1): without it every MoE router raises NameError. None selects their torch.mm branch.
    if importlib.util.find_spec("transformer_engine") is None and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        _applied.append("M1 moe_utils.te_general_gemm")
    # M2: MoEAlltoAllTokenDispatcher.token_dispatch / token_combine -> tensor_parallel.all_to_all ->
    # _AllToAll.forward passes the split sizes that _maybe_dtoh_and_synchronize made numpy arrays
    # (maybe_move_tensor_to_cpu(as_numpy=True)) to torch.distributed.all_to_all_single: TypeError under EP > 1.
    forward = mappings._AllToAll.forward
    if not getattr(forward, "_lists_split_sizes", False):
        def listed(ctx, group, input_, output_split_sizes, input_split_sizes):
            return forward(ctx, group, input_, _as_list(output_split_sizes), _as_list(input_split_sizes))

        listed._lists_split_sizes = True
        mappings._AllToAll.forward = staticmethod(listed)
        _applied.append("M2 _AllToAll split sizes as lists")
    return _applied


def reduce_experts_over_expert_dp(model) -> int:
    """M3: make DDP reduce the routed experts' gradients over the expert-data-parallel group; returns how many
    parameters it marked (0 where megatron's own choice is right).

    Megatron 0.16.1 (ColumnParallelLinear / RowParallelLinear.__init__, tensor_parallel/layers.py:886, 1209;
    GroupedMLP, moe/experts.py:203) sets `allreduce = not (is_expert and expert_model_parallel_size > 1)`, and
    DistributedDataParallel.__init__ (distributed_data_parallel.py:122) puts `allreduce` parameters in the
    dense buffers, reduced over the data-parallel group only. At EP 1 that is right only when the experts are
    split like the dense layers (etp == tp). Ours are whole on every rank (etp = 1): at tp > 1 each TP rank
    runs its experts on its own sequence-parallel shard of the tokens, so their gradients must also be summed
    over TP, which the expert-data-parallel group (dp x tp / etp ranks) does and the dense one does not. Without
    this, TP2 diverges from TP1 from the first step on: each TP rank steps its own copy of the experts with the
    gradient of its shard only, and the copies drift apart.
    `allreduce = False` moves them to DDP's expert buffers and megatron's expert optimizer, as at EP > 1."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    tc = model.config
    if not tc.num_moe_experts or tc.expert_model_parallel_size > 1 or \
            (tc.expert_tensor_parallel_size or tc.tensor_model_parallel_size) == tc.tensor_model_parallel_size:
        return 0
    params = [p for m in model.modules() if isinstance(m, MoELayer) for p in m.experts.parameters()]
    for p in params:  # the shared experts (MoELayer.shared_experts) are split over TP like a dense MLP: kept
        p.allreduce = False
    return len(params)
