"""Initial weights that depend only on the seed and each tensor's global identity, never on the layout.

`use_cpu_initialization` makes TP splits agree (each rank slices one full master weight), but under PP
a stage builds only its own layers, so the shared RNG stream would give layer k different weights at
PP1 and PP2. Seeding before each layer by its GLOBAL layer number, and the output layer by its own seed,
removes that: the same model is built at every TP/PP layout (tools/check_layouts.py proves it).
MoE experts are drawn again per GLOBAL expert index (an EP rank builds its own experts only, from the start of
the layer's stream), so the same experts come out at every EP layout too.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.transformer_layer import TransformerLayer, get_transformer_layer_offset
from megatron.core.utils import get_pg_rank

LAYER_SEED_BASE = 1_000_003
OUTPUT_SEED = 7_777_777
EXPERT_SEED_BASE = 2_000_003


class SeededTransformerLayer(TransformerLayer):
    """megatron's TransformerLayer, with the CPU RNG seeded from the global layer number first."""

    def __init__(self, config, submodules, layer_number: int = 1, hidden_dropout=None, pg_collection=None,
                 vp_stage=None):
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        offset = get_transformer_layer_offset(config, vp_stage, get_pg_rank(pg_collection.pp))
        torch.manual_seed(LAYER_SEED_BASE + layer_number + offset)
        super().__init__(config=config, submodules=submodules, layer_number=layer_number,
                         hidden_dropout=hidden_dropout, pg_collection=pg_collection, vp_stage=vp_stage)
        reseed_experts_(self.mlp, layer_number + offset)


@torch.no_grad()
def reseed_experts_(mlp, global_layer: int) -> None:
    """Redraw each local expert's fc1/fc2 (whole: expert TP is 1) with megatron's init methods from a seed of
    (global layer, global expert index); a dense MLP is left alone."""
    experts = getattr(getattr(mlp, "experts", None), "local_experts", None)
    if experts is None:
        return
    config = mlp.config
    # drawn on the GPU where there is one (a CPU draw of a large MoE's experts takes minutes): the same weights at
    # every layout of one device type
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    for index, expert in zip(mlp.local_expert_indices, experts):
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(EXPERT_SEED_BASE + 100_003 * global_layer + index)
            for linear, init in ((expert.linear_fc1, config.init_method),
                                 (expert.linear_fc2, config.output_layer_init_method)):
                full = torch.empty(linear.weight.shape, dtype=torch.float32, device=device)
                init(full)
                linear.weight.copy_(full)


def seeded_layer_spec(spec):
    """The same layer spec with layout-invariant initialisation."""
    spec.module = SeededTransformerLayer
    return spec


@torch.no_grad()
def init_output_weight(weight: torch.nn.Parameter, std: float, tp_rank: int) -> None:
    """Fill this rank's rows of a vocab-parallel [V_padded / tp, h] output weight from one full draw."""
    rows, hidden = weight.shape
    gen = torch.Generator().manual_seed(OUTPUT_SEED)
    full = torch.randn(rows * (tp_rank + 1), hidden, generator=gen) * std  # rows of earlier ranks first
    weight.copy_(full[tp_rank * rows:].to(weight.dtype))
