"""LoRA on MoE expert MLPs: an A/B pair per local expert and HF projection (gate_proj, up_proj on linear_fc1;
down_proj on linear_fc2) on megatron's per-expert linears (SequentialMLP's `local_experts.{i}.linear_fc1` /
`linear_fc2`, which `GroupedExperts` computes too), targeted by model.target_modules as the dense MLP's are.

They are the dense adapters of `models.lora` at expert TP 1 (parallel.etp): whole on the rank that holds the
expert, no TP communication, expert-parallel parameters (`allreduce=False`: megatron's DDP reduces them over the
expert-data-parallel group, as the experts' weights). A is drawn from a seed of the global layer, the projection
and the GLOBAL expert index, so every EP layout holds the same adapters; B starts at zero.

y_e = W_e x + scale * B_e A_e x. SequentialMLP calls each expert's linears: the forward hooks add the LoRA term.
GroupedExperts stacks the experts' weights for its grouped GEMMs: it stacks the effective weights W_e + scale *
B_e A_e instead (`models.lora.live_weight`), so autograd carries the weights' gradients to A and B. Expert
adapters therefore run without dropout (the stacked weights are shared by all the expert's tokens).

PEFT's names are the per-expert HF modules of the checkpoint (`model.layers.3.mlp.experts.5.gate_proj`): the
layout transformers 4 and the LoRA servers use, which peft converts when it loads the adapter onto transformers
5's fused experts (`gate_up_proj` at rank 2r and alpha 2 alpha: the same scale).
"""
from __future__ import annotations

import logging
from typing import Iterator

log = logging.getLogger(__name__)

EXPERT_SEED_STRIDE = 100_003  # the seeds of expert e's adapters: the dense ones' + stride x (e + 1)


def is_expert_linear(path: str) -> bool:
    """An expert linear's module path (local or full).

    >>> is_expert_linear("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1"), is_expert_linear("mlp.linear_fc1")
    (True, False)
    """
    return ".local_experts." in f".{path}"


def expert_linears(model) -> Iterator[tuple[object, int, str, object]]:
    """(transformer layer, global expert index, megatron linear name, module) of this stage's expert linears."""
    for layer in model.decoder.layers:
        experts = getattr(getattr(layer.mlp, "experts", None), "local_experts", None)
        for i, expert in enumerate(experts or ()):
            for name in ("linear_fc1", "linear_fc2"):
                yield layer, int(layer.mlp.local_expert_indices[i]), name, getattr(expert, name)


def expert_shapes(linear, name: str) -> dict[str, tuple[int, int]]:
    """(out, in) of each HF projection of an expert linear (whole: expert TP 1)."""
    out, fan_in = linear.weight.shape
    if name == "linear_fc1":
        return {"gate_proj": (out // 2, fan_in), "up_proj": (out // 2, fan_in)}
    return {"down_proj": (out, fan_in)}


def attach_expert_adapters(model, settings, attach) -> int:
    """Adapters on this stage's expert linears for the projections model.target_modules names, through
    `attach` (`models.lora._attach`); returns how many linears got them."""
    from rlhf_mcore.models.lora import SUBS

    count = 0
    for layer, expert, name, linear in expert_linears(model):
        subs = tuple(s for s in SUBS[name] if s in settings.target_modules)
        if subs:
            attach(linear, name, subs, expert_shapes(linear, name), layer.layer_number,
                   salt=EXPERT_SEED_STRIDE * (expert + 1))
            count += 1
    if count and settings.dropout:
        log.info("lora: expert adapters run without dropout (model.lora_dropout=%s applies to the others)",
                 settings.dropout)
    return count
