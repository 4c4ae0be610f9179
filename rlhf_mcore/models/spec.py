"""What a model family is: one `ModelSpec` (registered in `models.registry`, one file per family under
`models/families/`) and the weight-map rows its table is made of. Imports nothing of ours, so a family file
stays a leaf: adding a family is that file, one line in the registry, and its test.

A spec carries everything that differs between families:
- `config_fields(hf)`: megatron TransformerConfig fields from config.json beyond the shared GPT mapping
  (`models.transformer_config`), e.g. qk_layernorm;
- `check(hf, source)`: config.json values the family cannot convert (one ValueError);
- `layer_options(hf)`: keyword arguments of the layer-spec builder (`models.layer_specs`);
- `sliding_layers(hf)`: which layers attend within config.json's `sliding_window` (one bool per layer);
- `weights`: the HF <-> megatron weight-map table (`WeightRule` rows, "{i}" the layer index);
- `optional_weights(hf)`: rows only some config.json values have (Llama's linear biases);
- `decode_paths`: the native rollout's decode paths that run it ("static": the functional / graphed
  decoder of `rollout.static_decode`; "eager": megatron's modules);
- `text_config(hf)`: the language model's fields as one flat dict (a vision-language config.json nests them under
  `text_config`); `registry.language_config` applies it where config.json is read;
- `run_errors(cfg)`: run settings the family cannot take yet (one line each, asked by `config.validate`);
  `stage_errors(hf, parallel)`: the same for a layout that depends on config.json (Qwen3-VL's DeepStack layers);
- `fused_experts`: its checkpoints store each layer's experts in one tensor per projection (Qwen3-VL-MoE); they are
  read as the table's per-expert tensors and exports write them fused (`models.fused_experts`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

L, H = "decoder.layers.{i}.", "model.layers.{i}."


@dataclasses.dataclass(frozen=True, slots=True)
class WeightRule:
    mcore: str  # megatron key; "{i}" is the layer index
    hf: tuple[str, ...]  # HF key(s), fused in this order
    shapes: tuple[tuple[str, ...], ...]  # symbolic HF shape per key (names of `weights.model_dims` entries)
    fuse: str = "copy"  # copy | qkv | gate_up | vocab


def join_fused(fuse: str, tensors: list[torch.Tensor], groups: int = 1) -> torch.Tensor:
    """Rows of the sub-projections in megatron's fused order along dim 0: `qkv` per query group
    ([q heads of the group; k; v], `groups` groups), `gate_up` [gate; up]. Also used on one TP rank's rows
    (its local groups) by the LoRA adapters (`models.lora`).

    >>> join_fused("qkv", [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8])], 2).tolist()
    [1, 2, 5, 7, 3, 4, 6, 8]
    """
    if fuse == "qkv":
        rest = tensors[0].shape[1:]
        return torch.cat([t.reshape(groups, -1, *rest) for t in tensors], dim=1).reshape(-1, *rest)
    if fuse == "gate_up":
        return torch.cat(tensors, dim=0)
    raise ValueError(f"join_fused: unknown fuse {fuse!r} (qkv or gate_up)")


def num_experts(hf: dict) -> int:
    """The expert count of an MoE config.json: `num_experts` (Qwen) or `num_local_experts` (Mixtral, and what
    transformers 5 writes for Qwen3-MoE); 0 for a dense model."""
    return hf.get("num_experts") or hf.get("num_local_experts") or 0


def no_fields(hf: dict) -> dict:
    return {}


def no_sliding_layers(hf: dict) -> tuple[bool, ...]:
    return (False,) * hf.get("num_hidden_layers", 0)


def active_window(window: int | None, length: int) -> int | None:
    """The window where it masks something among `length` keys; None where it covers them all (then the plain
    causal kernels run, as for a model without a window).

    >>> active_window(8, 8), active_window(8, 9), active_window(None, 9)
    (None, 8, None)
    """
    return window if window is not None and length > window else None


def every_layer_slides(hf: dict) -> tuple[bool, ...]:
    """Mistral, Mixtral: every layer attends within `sliding_window` when config.json sets one.

    >>> every_layer_slides({"num_hidden_layers": 2, "sliding_window": 8}), every_layer_slides({"num_hidden_layers": 1})
    ((True, True), (False,))
    """
    return (bool(hf.get("sliding_window")),) * hf.get("num_hidden_layers", 0)


def switched_layers_slide(hf: dict) -> tuple[bool, ...]:
    """Qwen3-MoE: every layer slides where `use_sliding_window` is true (and `sliding_window` set)."""
    return every_layer_slides(hf) if hf.get("use_sliding_window") else no_sliding_layers(hf)


def typed_layers_slide(hf: dict) -> tuple[bool, ...]:
    """Qwen2, Qwen3: with `use_sliding_window`, the layers `layer_types` calls "sliding_attention" (transformers
    writes it), else (older config.json files) the layers from `max_window_layers` (default 28) on.

    >>> typed_layers_slide({"num_hidden_layers": 3, "sliding_window": 8, "use_sliding_window": True,
    ...                     "max_window_layers": 1})
    (False, True, True)
    >>> typed_layers_slide({"num_hidden_layers": 2, "sliding_window": 8, "use_sliding_window": False,
    ...                     "layer_types": ["sliding_attention", "sliding_attention"]})
    (False, False)
    """
    if not (hf.get("use_sliding_window") and hf.get("sliding_window")):
        return no_sliding_layers(hf)
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                      for i in range(hf.get("num_hidden_layers", 0))]
    return tuple(t == "sliding_attention" for t in types)


def no_weights(hf: dict) -> tuple:
    return ()


def same_config(hf: dict) -> dict:
    return hf


def no_run_errors(cfg) -> list[str]:
    return []


def no_stage_errors(hf: dict, parallel) -> list[str]:
    return []


def no_attention_bias(hf: dict, source: str) -> None:
    """o_proj and MLP biases (config.json attention_bias / mlp_bias) this family's converter does not map."""
    for field, what in (("attention_bias", "o_proj biases"), ("mlp_bias", "MLP biases")):
        if hf.get(field):
            raise ValueError(f"{source}: config field '{field}'=true is not supported for "
                             f"{hf.get('model_type', 'this family')} ({what} are mapped for Llama only). Use a "
                             "model without them.")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str  # registry key
    model_types: tuple[str, ...]  # HF config.json "model_type" values this spec reads
    architectures: tuple[str, ...]  # HF "architectures" entries (causal LM and sequence classification)
    weights: tuple[WeightRule, ...]  # the weight-map table
    qkv_bias: bool = False  # q/k/v projections always carry a bias (Qwen2); Llama's optional ones: optional_weights
    config_fields: Callable[[dict], dict] = no_fields
    check: Callable[[dict, str], None] = no_attention_bias
    layer_options: Callable[[dict], dict] = no_fields
    sliding_layers: Callable[[dict], tuple[bool, ...]] = no_sliding_layers
    optional_weights: Callable[[dict], tuple[WeightRule, ...]] = no_weights
    decode_paths: tuple[str, ...] = ("static", "eager")
    # A vision-language family (Qwen2.5-VL): its LM's fields as one flat dict, the run settings it cannot take yet,
    # other prefixes its checkpoints store the table's tensors under, and the vision tower's prefix (models.vision)
    text_config: Callable[[dict], dict] = same_config
    run_errors: Callable[[object], list[str]] = no_run_errors
    stage_errors: Callable[[dict, object], list[str]] = no_stage_errors  # (flat config.json, cfg.parallel)
    checkpoint_aliases: tuple[tuple[str, str], ...] = ()  # (prefix some checkpoints use, the table's prefix)
    vision_prefix: str | None = None  # HF tensors under it belong to the vision tower, not the table
    vision_tower: Callable[[], type] | None = None  # the tower's transformers class (built from vision_config)
    export_prefixes: tuple[tuple[str, str], ...] = ()  # (the table's prefix, what an HF export writes instead)
    fused_experts: bool = False  # its checkpoints store experts fused: exports write them so (models.fused_experts)


# The GPT structure every family shares (RMSNorm, RoPE, SwiGLU, GQA), in Llama's HF names.
BASE_WEIGHTS = (
    WeightRule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), (("vocab", "h"),),
               "vocab"),
    WeightRule(L + "input_layernorm.weight", (H + "input_layernorm.weight",), (("h",),)),
    WeightRule(L + "self_attention.linear_qkv.weight", tuple(H + f"self_attn.{p}_proj.weight" for p in "qkv"),
               (("q", "h"), ("kv", "h"), ("kv", "h")), "qkv"),
    WeightRule(L + "self_attention.linear_proj.weight", (H + "self_attn.o_proj.weight",), (("h", "q"),)),
    WeightRule(L + "pre_mlp_layernorm.weight", (H + "post_attention_layernorm.weight",), (("h",),)),
    WeightRule(L + "mlp.linear_fc1.weight", (H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"),
               (("ffn", "h"), ("ffn", "h")), "gate_up"),
    WeightRule(L + "mlp.linear_fc2.weight", (H + "mlp.down_proj.weight",), (("h", "ffn"),)),
    WeightRule("decoder.final_layernorm.weight", ("model.norm.weight",), (("h",),)),
)
# The base table without its dense MLP (every layer of an MoE family has experts instead).
NO_MLP = tuple(r for r in BASE_WEIGHTS if ".mlp." not in r.mcore)
# Qwen's experts (Qwen3-MoE, Qwen3-VL-MoE): router `mlp.gate`, expert e's gate / up / down projections; megatron's
# SequentialMLP expert e holds [gate; up] in linear_fc1. Fused checkpoints are read as these (`models.fused_experts`).
_EXPERT = "mlp.experts.local_experts.{e}."
QWEN_EXPERTS = (
    WeightRule(L + "mlp.router.weight", (H + "mlp.gate.weight",), (("experts", "h"),)),
    WeightRule(L + _EXPERT + "linear_fc1.weight",
               (H + "mlp.experts.{e}.gate_proj.weight", H + "mlp.experts.{e}.up_proj.weight"),
               (("moe_ffn", "h"), ("moe_ffn", "h")), "gate_up"),
    WeightRule(L + _EXPERT + "linear_fc2.weight", (H + "mlp.experts.{e}.down_proj.weight",), (("h", "moe_ffn"),)),
)
# Per-head RMSNorm of queries and keys (megatron qk_layernorm; Qwen3 and Qwen3-MoE), [head_dim] each.
QK_NORMS = (
    WeightRule(L + "self_attention.q_layernorm.weight", (H + "self_attn.q_norm.weight",), (("d",),)),
    WeightRule(L + "self_attention.k_layernorm.weight", (H + "self_attn.k_norm.weight",), (("d",),)),
)
# Biases: q/k/v fused like their weights (Qwen2 always; Llama with attention_bias), and the rest of Llama's
# attention_bias + mlp_bias (megatron add_bias_linear): o_proj, [gate; up] fused like fc1's weight, down.
QKV_BIAS = WeightRule(L + "self_attention.linear_qkv.bias", tuple(H + f"self_attn.{p}_proj.bias" for p in "qkv"),
                      (("q",), ("kv",), ("kv",)), "qkv")
LINEAR_BIASES = (
    QKV_BIAS,
    WeightRule(L + "self_attention.linear_proj.bias", (H + "self_attn.o_proj.bias",), (("h",),)),
    WeightRule(L + "mlp.linear_fc1.bias", (H + "mlp.gate_proj.bias", H + "mlp.up_proj.bias"),
               (("ffn",), ("ffn",)), "gate_up"),
    WeightRule(L + "mlp.linear_fc2.bias", (H + "mlp.down_proj.bias",), (("h",),)),
)
