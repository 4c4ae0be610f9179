"""Build the megatron models of every role from one HF config dict.

actor / ref -> GPTModel with `HiddenStatesHead` (log-probs from hidden states + output weight)
critic      -> GPTModel with a per-token `ScalarHead` (value)
reward      -> GPTModel with a `ScalarHead` read at the last valid token (score)
All live on every rank, in the same TP/PP/DP groups.

The transformer-layer ModuleSpec comes from `rlhf_mcore.models.layer_specs` (by model.attention_backend).
LoRA (model.lora_rank > 0, or `lora=` for a critic) attaches here, the one model transform at build time
(`rlhf_mcore.models.lora.apply_lora`): the actor by default, any trainable role given settings.
"""
from __future__ import annotations

import logging

import torch
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from rlhf_mcore.logs import log_once
from rlhf_mcore.models import rope
from rlhf_mcore.models.heads import HiddenStatesHead, ScalarHead
from rlhf_mcore.models.init import init_output_weight, seeded_layer_spec
from rlhf_mcore.models.layer_specs import LAYER_SPECS, resolve_backend
from rlhf_mcore.models.lora import LoraSettings, apply_lora
from rlhf_mcore.models.norm import RMSNorm
from rlhf_mcore.models.packed import enable_position_rope
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.roles import role_spec
from rlhf_mcore.models.transformer_config import padded_vocab_size, rope_theta, to_transformer_config

log = logging.getLogger(__name__)
EMBEDDING_SEED = 31337


def block_spec(layer_spec, backend: str, config, pp_rank: int):
    """This stage's layers plus the final norm (ours, except with Transformer Engine)."""
    if backend == "te":
        return layer_spec
    num = get_num_layers_to_build(config, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * num, layer_norm=RMSNorm)


def choose_layer_spec(name: str, options: dict | None = None, window: int | None = None):
    """(ModuleSpec, backend name actually used); `options`: the family's (`ModelSpec.layer_options`); window: the
    model's sliding window (`transformer_config.sliding_window`), which only sdpa runs."""
    backend = resolve_backend(name, window)
    return seeded_layer_spec(LAYER_SPECS.get(backend)(**(options or {}))), backend


def build_model(role: str, hf: dict, model_cfg, parallel_cfg, ctx, source: str = "config.json", lora="model"):
    """One GPTModel chunk for this rank's pipeline stage, on ctx.device, not yet wrapped for DDP. Weights are
    drawn from fixed seeds (the same at every layout) inside a forked RNG: the caller's RNG state is kept.
    lora: LoraSettings or None; "model" = model.lora_* for the actor, none for the other roles."""
    devices = [ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()] \
        if ctx.device.type == "cuda" else []
    if lora == "model":
        lora = LoraSettings.from_model_cfg(model_cfg) if role == "actor" else None
    if lora is not None and not role_spec(role).trainable:
        raise ValueError(f"LoRA on the frozen role {role!r}: adapters go on trainable roles only.")
    with torch.random.fork_rng(devices=devices):
        return apply_lora(_build_model(role, hf, model_cfg, parallel_cfg, ctx, source), lora, ctx)


def with_sdpa_kernel(layer_spec, kernel: str):
    """A copy of the layer spec whose SDPAttention puts SDPA kernel `kernel` first (model.sdpa_kernel)."""
    import copy

    from megatron.core.transformer.spec_utils import ModuleSpec

    from rlhf_mcore.models.attention import SDPAttention

    layer_spec = copy.deepcopy(layer_spec)
    attention = layer_spec.submodules.self_attention.submodules
    if attention.core_attention is SDPAttention:
        attention.core_attention = ModuleSpec(module=SDPAttention, params={"sdpa_kernel": kernel})
    return layer_spec


def _build_model(role: str, hf: dict, model_cfg, parallel_cfg, ctx, source: str):
    from megatron.core.models.gpt import GPTModel

    spec = role_spec(role)
    tc = to_transformer_config(hf, model_cfg, parallel_cfg, source)
    family = spec_for_hf_config(hf, source)
    hf = family.text_config(hf)  # a vision-language config.json nests the LM's fields
    # models.routing: record, replay (the reference too: R3 replays the rollout's experts in every pass)
    tc.moe_enable_routing_replay = bool(tc.num_moe_experts) and role in ("actor", "ref")
    if tc.num_moe_experts:
        from rlhf_mcore.moe_compat import apply_moe_patches

        apply_moe_patches()
    window = tc.window_size[0] + 1 if tc.window_size else None
    layer_spec, backend = choose_layer_spec(model_cfg.attention_backend, family.layer_options(hf), window)
    if tc.num_moe_experts:  # the experts module by model.moe_expert_impl (models.experts_grouped)
        from rlhf_mcore.models.experts_grouped import use_expert_impl

        layer_spec = use_expert_impl(layer_spec, getattr(model_cfg, "moe_expert_impl", "auto"), ctx.device,
                                     tc.params_dtype)
    if backend == "sdpa" and getattr(model_cfg, "sdpa_kernel", "auto") != "auto":
        layer_spec = with_sdpa_kernel(layer_spec, model_cfg.sdpa_kernel)
    log_once(log, f"layer spec {backend}", "layer spec: %s (attention backend %s%s)",
             "transformer-engine" if backend == "te" else "megatron local", backend,
             f", SDPA kernel {model_cfg.sdpa_kernel} first"
             if backend == "sdpa" and getattr(model_cfg, "sdpa_kernel", "auto") != "auto" else "")
    lm_head = spec.lm_head
    tied = lm_head and bool(hf.get("tie_word_embeddings", False))
    torch.manual_seed(EMBEDDING_SEED)  # the embedding is drawn first, identically at every layout
    model = GPTModel(
        config=tc,
        transformer_layer_spec=block_spec(layer_spec, backend, tc, ctx.pp_rank),
        vocab_size=padded_vocab_size(hf["vocab_size"], model_cfg.make_vocab_size_divisible_by),
        max_sequence_length=hf.get("max_position_embeddings", model_cfg.max_position_embeddings),
        pre_process=ctx.is_first_stage,
        post_process=ctx.is_last_stage,
        share_embeddings_and_output_weights=tied,
        position_embedding_type="mrope" if tc.mrope_section else "rope",  # M-RoPE: [3, B, S] positions
        rotary_base=rope_theta(hf, source),
        parallel_output=True,
    )
    rope.apply_to(model.rotary_pos_emb, hf)  # config.json's RoPE type (llama3, linear, ...): HF's frequencies
    if ctx.is_last_stage:
        tp_group = ctx.pgs.tp
        if lm_head:
            if not tied:
                init_output_weight(model.output_layer.weight, tc.init_method_std, ctx.tp_rank)
            model.output_layer = HiddenStatesHead(model.output_layer, tp_group)
        else:
            model.output_layer = ScalarHead(tc.hidden_size, 1, tc.init_method_std, tc.params_dtype,
                                            tc.sequence_parallel, tp_group)
    model.vocab_size_unpadded = hf["vocab_size"]
    model.role = role
    model.family = family.name  # the rollout asks the family which decode paths run it
    model.packed_qkv_format = "thd" if backend == "te" else "sbhd"  # see rlhf_mcore.models.packed
    if backend != "te":
        enable_position_rope(model)
    model.to(device=ctx.device, dtype=tc.params_dtype)  # norms are built in fp32; bf16 runs keep all in bf16
    if tc.num_moe_experts:  # whole experts at tp > 1: their grads summed over TP too (moe_compat M3)
        from rlhf_mcore.moe_compat import reduce_experts_over_expert_dp

        reduce_experts_over_expert_dp(model)
    if not spec.trainable:
        model.requires_grad_(False)
        model.eval()
    return model


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
