"""Parameters per rank at a TP x PP x EP layout, counted from config.json the way megatron shards them (the memory
plan's exact terms; `rlhf_mcore.plan`).

A GPT layer holds its norms whole on every TP rank (input and pre-MLP RMSNorm, Qwen3's per-head q/k norms), and
splits its projections over TP: q/k/v (and their biases) by heads, the output projection by its input, the MLP's
gate/up (and their biases) by rows and its down projection by its input; the output and down projections' biases
(Llama's attention_bias + mlp_bias) are whole on every TP rank. An MoE layer holds its router whole and `experts / ep`
whole experts (each gate/up/down, `parallel.etp` = 1). Layers split evenly over PP stages. The first stage
holds the embedding ([padded vocab / tp, h]); the last holds the final norm and the head: the LM head
([padded vocab / tp, h]) unless tied on a single stage (megatron keeps a copy on the last stage when tied across
stages), or a scalar head ([1, h], whole) for a critic or reward model.
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.models.spec import num_experts
from rlhf_mcore.models.transformer_config import padded_vocab_size

WEIGHT_BYTES = {"bf16": 2, "fp32": 4}  # bytes of a parameter (and of an activation) in model.dtype


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the count needs of a model (from config.json and its family's fields)."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    head_dim: int
    vocab: int
    qkv_bias: bool = False
    linear_bias: bool = False  # a bias on every linear (megatron add_bias_linear)
    qk_norm: bool = False
    experts: int = 0
    moe_ffn: int = 0
    tied: bool = False
    tower: int = 0  # a vision LM's tower + merger parameters (whole on every rank), `tower_params`
    static_decode: bool = True  # the family's ModelSpec.decode_paths has the static decoder (MoE: eager)

    @classmethod
    def of(cls, hf: dict) -> "Shape":
        from rlhf_mcore.models.registry import spec_for_hf_config

        spec = spec_for_hf_config(hf)
        tower = vision_params(hf)
        hf = spec.text_config(hf)  # a vision-language config.json nests the LM's fields; the tower: `tower`
        fields = spec.config_fields(hf)
        heads = hf["num_attention_heads"]
        experts = num_experts(hf)
        return cls(layers=hf["num_hidden_layers"], hidden=hf["hidden_size"], ffn=hf["intermediate_size"], heads=heads,
                   groups=hf.get("num_key_value_heads") or heads,
                   head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                   vocab=hf["vocab_size"], qkv_bias=spec.qkv_bias or bool(fields.get("add_bias_linear")),
                   linear_bias=bool(fields.get("add_bias_linear")), qk_norm=bool(fields.get("qk_layernorm")),
                   experts=experts, moe_ffn=fields.get("moe_ffn_hidden_size") or 0,
                   tied=bool(hf.get("tie_word_embeddings", False)), tower=tower,
                   static_decode="static" in spec.decode_paths)


def tower_params(vision: dict) -> int:
    """Parameters of transformers' Qwen2.5-VL vision tower + merger (config.json's `vision_config`): the patch
    embedding (a bias-free convolution), per block two RMSNorms, q/k/v and output projections and the gated MLP
    (all with biases), and the merger (an RMSNorm and two linears over merge^2 concatenated patches).

    >>> tower_params({"depth": 1, "hidden_size": 4, "intermediate_size": 8, "in_channels": 1, "patch_size": 2,
    ...               "temporal_patch_size": 1, "spatial_merge_size": 2, "out_hidden_size": 3})
    547

    (embedding 16; block: norms 8, q/k/v 48 + 12, output 16 + 4, gate/up 64 + 16, down 32 + 4 = 204; merger:
    norm 4, 256 + 16, 48 + 3 = 327.)
    """
    d, inter, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    embed = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2 * d
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * (d * inter + inter) + (inter * d + d)
    wide = d * vision["spatial_merge_size"] ** 2
    merger = d + (wide * wide + wide) + (wide * out + out)
    return embed + vision["depth"] * block + merger


def qwen3_vl_tower_params(vision: dict) -> int:
    """Parameters of transformers' Qwen3-VL vision tower (`Qwen3VLVisionModel`, config.json's `vision_config`): the
    patch embedding (a convolution with bias), the learned position table, per block two LayerNorms, q/k/v and
    output projections and a plain GELU MLP (all with biases), the merger (a LayerNorm over a patch, two linears
    over merge^2 patches) and one DeepStack merger per level (its LayerNorm over the merge^2 patches).

    >>> qwen3_vl_tower_params({"depth": 1, "hidden_size": 4, "intermediate_size": 8, "in_channels": 1,
    ...     "patch_size": 2, "temporal_patch_size": 1, "spatial_merge_size": 2, "out_hidden_size": 3,
    ...     "num_position_embeddings": 4, "deepstack_visual_indexes": [0]})
    894

    (embedding 16 + 4, positions 16; block: norms 16, q/k/v 48 + 12, output 16 + 4, fc1 32 + 8, fc2 32 + 4 = 172;
    merger: norm 8, 256 + 16, 48 + 3 = 331; DeepStack: norm 32, 256 + 16, 48 + 3 = 355 a level.)
    """
    d, inter, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    embed = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2 * d + d
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * inter + inter) + (inter * d + d)
    wide = d * vision["spatial_merge_size"] ** 2
    linears = (wide * wide + wide) + (wide * out + out)
    levels = len(vision.get("deepstack_visual_indexes") or ())
    return (embed + vision["num_position_embeddings"] * d + vision["depth"] * block + 2 * d + linears
            + levels * (2 * wide + linears))


TOWER_PARAMS = {"qwen2_5_vl": tower_params, "qwen3_vl": qwen3_vl_tower_params,  # per vision family
                "qwen3_vl_moe": qwen3_vl_tower_params}  # the same tower


def experts_per_token(hf: dict) -> int:
    """The experts each token is routed to (config.json's `num_experts_per_tok`, a vision LM's under text_config);
    1 for a dense model.

    >>> experts_per_token({"text_config": {"num_experts_per_tok": 8}}), experts_per_token({"hidden_size": 4})
    (8, 1)
    """
    from rlhf_mcore.models.families.vision_family import text_config

    return int(text_config(hf).get("num_experts_per_tok") or 1)


def vision_params(hf: dict) -> int:
    """A vision LM's tower parameters from its whole config.json (its family's count); 0 for a text model."""
    from rlhf_mcore.models.registry import spec_for_hf_config

    spec = spec_for_hf_config(hf)
    return TOWER_PARAMS[spec.name](hf["vision_config"]) if spec.vision_prefix and "vision_config" in hf else 0


def layer_params(s: Shape, tp: int, ep: int) -> int:
    """One decoder layer's parameters on one rank.

    >>> layer_params(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10), tp=1, ep=1)
    592

    (norms 2 x 8, q/k/v (2 + 2 x 1) x 4 x 8 = 128, output 8 x 8 = 64, gate/up/down 3 x 16 x 8 = 384.)
    """
    qkv = (s.heads + 2 * s.groups) * s.head_dim
    attention = qkv * s.hidden // tp + s.hidden * s.heads * s.head_dim // tp
    attention += qkv // tp if s.qkv_bias else 0
    attention += 2 * s.head_dim if s.qk_norm else 0
    norms = 2 * s.hidden
    if s.experts:
        mlp = s.experts * s.hidden + (s.experts // ep) * 3 * s.moe_ffn * s.hidden
    else:
        mlp = 3 * s.ffn * s.hidden // tp
    if s.linear_bias:  # output and down projections: whole; gate/up: by rows (q/k/v: qkv_bias above)
        attention += s.hidden
        mlp += 2 * s.ffn // tp + s.hidden
    return norms + attention + mlp


def rank_expert_params(s: Shape, pp: int, ep: int) -> int:
    """The routed experts' parameters on a rank (whole experts: the same at every TP rank); 0 for a dense model.

    >>> rank_expert_params(Shape(layers=4, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10, experts=8,
    ...                          moe_ffn=4), pp=2, ep=4)
    384

    (2 layers x 2 experts x gate/up/down 3 x 4 x 8.)
    """
    return (s.layers // pp) * (s.experts // ep) * 3 * s.moe_ffn * s.hidden if s.experts else 0


def rank_params(s: Shape, tp: int, pp: int, ep: int, pp_rank: int, lm_head: bool = True,
                vocab_divisible_by: int = 128) -> int:
    """Parameters on a rank of pipeline stage `pp_rank` (every TP / EP rank of a stage holds as many).
    `lm_head`: the actor's (or reference's) vocabulary head; False: a critic's or reward model's scalar head."""
    vocab = padded_vocab_size(s.vocab, vocab_divisible_by) * s.hidden // tp
    total = (s.layers // pp) * layer_params(s, tp, ep)
    first, last = pp_rank == 0, pp_rank == pp - 1
    total += vocab if first else 0
    if last:
        total += s.hidden  # the final norm
        if not lm_head:
            total += s.hidden
        elif not s.tied or pp > 1:
            total += vocab
    return total
