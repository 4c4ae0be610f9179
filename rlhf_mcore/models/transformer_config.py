"""HF `config.json` dict -> megatron `TransformerConfig`, the one conversion every model build uses.

A run without `model.hf_path` describes its model inline; `hf_config_from_model_config` turns those
fields into the same HF-style dict (`models.hf_fields`), so there is a single path from config to megatron.
"""
from __future__ import annotations

import json
import math
import os

import torch

from rlhf_mcore.models.activations import activation_error, activation_for
from rlhf_mcore.models.spec import ModelSpec


def load_hf_config(model_cfg) -> dict:
    """The HF config dict of the policy: read from model.hf_path, or built from the inline fields."""
    if not model_cfg.hf_path:
        from rlhf_mcore.models.hf_fields import hf_config_from_model_config  # keeps the import chain short

        return hf_config_from_model_config(model_cfg)
    path = os.path.join(model_cfg.hf_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"model.hf_path: no config.json in {model_cfg.hf_path!r}. Point it at an HF model directory.")
    with open(path) as f:
        return json.load(f)


def rope_theta(hf: dict, source: str) -> float:
    """RoPE base from either `rope_theta` (transformers < 5) or `rope_parameters` (>= 5); a RoPE type outside
    `models.rope.ROPE_TYPES` is refused (`rope_parameters` or the older `rope_scaling`: a config may carry both)."""
    from rlhf_mcore.models.rope import rope_base, rope_errors

    errs = rope_errors(hf, source)
    if errs:
        raise ValueError("\n".join(errs))
    return rope_base(hf)


def architecture_errors(hf: dict, source: str) -> list[str]:
    """One line per config.json field the builder cannot honour, each naming the field and what to do; [] when
    the model builds. `--validate-only` reports these before any model is built, and the builder raises them."""
    from rlhf_mcore.models.registry import spec_for_hf_config  # here: keeps the build's import chain short

    try:
        spec = spec_for_hf_config(hf, source)
    except ValueError as e:
        return [str(e)]
    hf = spec.text_config(hf)  # a vision-language config.json nests the LM's fields
    errs = [e for e in (activation_error(hf, source),) if e]
    for check in (lambda: spec.check(hf, source), lambda: rope_theta(hf, source)):
        try:
            check()
        except ValueError as e:
            errs.append(str(e))
    errs += [f"{source}: missing required field {key!r}. Add it to config.json (an HF model directory has it)."
             for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
             if not hf.get(key)]
    return errs


def sliding_window(hf: dict, spec: ModelSpec) -> int | None:
    """The window W some layers attend within (key j visible to query i iff i - W < j <= i, transformers'
    `sliding_window_overlay`), or None where no layer slides (`ModelSpec.sliding_layers`: Mistral's every layer,
    Qwen2/Qwen3's by use_sliding_window and layer_types / max_window_layers).

    >>> from rlhf_mcore.models.spec import ModelSpec, typed_layers_slide
    >>> qwen = ModelSpec("q", ("qwen3",), (), (), sliding_layers=typed_layers_slide)
    >>> hf = {"num_hidden_layers": 2, "sliding_window": 8, "max_window_layers": 1}
    >>> [sliding_window({**hf, "use_sliding_window": on}, qwen) for on in (False, True)]
    [None, 8]
    """
    return hf["sliding_window"] if any(spec.sliding_layers(hf)) else None


def window_fields(hf: dict, spec: ModelSpec) -> dict:
    """megatron's sliding-window fields: `window_size` (W - 1, 0) (flash-attention's left / right reach) and
    `window_attn_skip_freq` the per-layer list (1 = slides); {} where no layer slides.

    >>> from rlhf_mcore.models.spec import ModelSpec, every_layer_slides
    >>> window_fields({"num_hidden_layers": 2, "sliding_window": 8}, ModelSpec("m", (), (), (),
    ...                                                                          sliding_layers=every_layer_slides))
    {'window_size': (7, 0), 'window_attn_skip_freq': [1, 1]}
    """
    window = sliding_window(hf, spec)
    if window is None:
        return {}
    return {"window_size": (window - 1, 0), "window_attn_skip_freq": [int(s) for s in spec.sliding_layers(hf)]}


def _check_supported(hf: dict, source: str) -> None:
    errs = architecture_errors(hf, source)
    if errs:
        raise ValueError("\n".join(errs))


def padded_vocab_size(vocab_size: int, divisible_by: int) -> int:
    """Vocab padded to a multiple of `divisible_by` (layout-independent: TP must divide divisible_by).

    >>> padded_vocab_size(49152, 128), padded_vocab_size(250, 128)
    (49152, 256)
    """
    return int(math.ceil(vocab_size / divisible_by) * divisible_by)


def to_transformer_config(hf: dict, model_cfg, parallel_cfg, source: str = "config.json"):
    """Build megatron's TransformerConfig for this model at this parallel layout."""
    from megatron.core.transformer import TransformerConfig

    from rlhf_mcore.models.registry import spec_for_hf_config  # here: keeps the build's import chain short
    from rlhf_mcore.models.rope import megatron_fields

    _check_supported(hf, source)
    spec = spec_for_hf_config(hf, source)
    hf = spec.text_config(hf)
    heads = hf["num_attention_heads"]
    bf16 = model_cfg.dtype == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    recompute = {"none": {}, "full": dict(recompute_granularity="full", recompute_method="uniform",
                                          recompute_num_layers=1),
                 "selective": dict(recompute_granularity="selective")}[model_cfg.recompute]
    on_gpu = torch.cuda.is_available()
    family = {"add_bias_linear": False, **spec.config_fields(hf)}  # what differs per family (models/families/)
    activation = activation_for(hf)
    if family.get("num_moe_experts"):  # the load-balancing and z losses are the run's choice (default off)
        aux, z = getattr(model_cfg, "moe_aux_loss_coeff", 0.0), getattr(model_cfg, "moe_z_loss_coeff", 0.0)
        family.update(moe_aux_loss_coeff=aux, moe_router_load_balancing_type="aux_loss" if aux > 0 else "none",
                      moe_z_loss_coeff=z or None,
                      moe_router_bias_update_rate=0.0)  # an expert bias (if any) stays frozen for RL
    tc = TransformerConfig(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads,
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads,
        normalization="RMSNorm",
        layernorm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=activation.fn,  # gated: SwiGLU, GeGLU, ... (models.activations)
        add_qkv_bias=spec.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=float(hf.get("initializer_range", model_cfg.init_std)),
        tensor_model_parallel_size=parallel_cfg.tp,
        pipeline_model_parallel_size=parallel_cfg.pp,
        expert_model_parallel_size=getattr(parallel_cfg, "ep", 1),
        expert_tensor_parallel_size=1,  # each expert whole on its rank (parallel.etp=1; megatron's default is tp)
        sequence_parallel=parallel_cfg.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=bf16,
        use_cpu_initialization=True,  # identical initial weights at every TP/PP layout
        perform_initialization=True,
        batch_p2p_sync=on_gpu,  # the sync variant calls torch.cuda.synchronize after every p2p
        variable_seq_lengths=True,  # micro-batches are padded to their own longest sequence
        moe_token_dispatcher_type="alltoall",  # required by variable_seq_lengths even for dense models
        calculate_per_token_loss=True,  # losses return (sum, count); megatron divides by the global count
        bias_activation_fusion=on_gpu and activation.fusable,  # megatron's compiled SwiGLU (no compiler on CPU)
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,  # needs apex
        deallocate_pipeline_outputs=True,
        **recompute,
        **family,
        **window_fields(hf, spec),
    )
    for key, value in megatron_fields(hf).items():  # YaRN: megatron's attention scales cos / sin (models.rope)
        setattr(tc, key, value)
    return tc
