"""LoRA on MoE expert MLPs: an A/B pair per local expert and HF projection (gate_proj, up_proj on linear_fc1;
down_proj on linear_fc2) on megatron's per-expert linears (SequentialMLP's `local_experts.{i}.linear_fc1` /
`linear_fc2`, which `GroupedExperts` computes too), targeted by model.target_modules as the dense MLP's are.

They are the dense adapters of `models.lora` at expert TP 1 (parallel.etp): whole on the rank that holds the
expert, no TP communication, expert-parallel parameters (`allreduce=False`: megatron's DDP reduces them over the
expert-data-parallel group, as the experts' weights). A is drawn from a seed of the global layer, the projection
and the GLOBAL expert index, so every EP layout holds the same adapters; B starts at zero.

y_e = W_e x + scale * B_e A_e x. SequentialMLP calls each expert's linears: the forward hooks add the LoRA term.
GroupedExperts adds it as two more low-rank grouped GEMMs per linear (`grouped_lora_term`: x A_e^T, then B_e^T),
beside the base's, never building W_e + scale B_e A_e (which cost 2.9x the update's time at the Qwen3-30B shape:
benchmarks/2026-12-06-lora-moe). model.lora_dropout applies to their input in both, as to the dense adapters'.

PEFT's names are the per-expert HF modules of the checkpoint (`model.layers.3.mlp.experts.5.gate_proj`): the
layout transformers 4 and the LoRA servers use, which peft converts when it loads the adapter onto transformers
5's fused experts (`gate_up_proj` at rank 2r and alpha 2 alpha: the same scale).
"""
from __future__ import annotations

import logging
import re
from typing import Iterator

import torch

log = logging.getLogger(__name__)

EXPERT_SEED_STRIDE = 100_003  # the seeds of expert e's adapters: the dense ones' + stride x (e + 1)


def text_experts(hf_config: dict) -> int:
    """The expert count of a config.json's language model (a vision LM's text_config), 0 for a dense one."""
    from rlhf_mcore.models.registry import spec_for_hf_config
    from rlhf_mcore.models.spec import num_experts

    return num_experts(spec_for_hf_config(hf_config).text_config(hf_config))


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
    halves = [s for s in ("gate_proj", "up_proj") if s in settings.target_modules]
    if count and len(halves) == 1:
        other = "up_proj" if halves == ["gate_proj"] else "gate_proj"
        log.warning("lora: the experts' %s is adapted but not their %s: this trains, but peft fuses the two when it "
                    "loads the adapter onto transformers 5's MoE experts and refuses one alone (\"Cannot convert "
                    "PEFT target(s) %s without also targeting %s\"). Add %s to model.target_modules for an adapter "
                    "peft loads.", halves[0], other, halves[0], other, other)
    return count


def has_expert_lora(experts) -> bool:
    """The local experts (SequentialMLP's `local_experts`) carry adapters and they are on."""
    return any(getattr(getattr(e, name), "lora_enabled", False) and hasattr(getattr(e, name), "lora_A")
               for e in experts[:1] for name in ("linear_fc1", "linear_fc2"))


def grouped_lora_term(experts, name: str, x: torch.Tensor, linear) -> torch.Tensor | None:
    """scale * B_e A_e x_e for every expert's tokens at once ([T, out], None where `name` has no adapters on):
    the grouped experts' LoRA term for linear_fc1 / linear_fc2, as two low-rank grouped GEMMs through
    `linear(x, w)` (x_e @ w_e^T per expert group, w stacked [E, N, K]; `experts_grouped.grouped_swiglu`), never a
    W + B A weight. The A of the adapted projections are stacked into one GEMM ([E, n r, in]); each projection's
    B is its own, and an unadapted one contributes zeros ([gate; up] along the output: linear_fc1's layout)."""
    linears = [getattr(e, name) for e in experts]
    first = linears[0]
    if not getattr(first, "lora_enabled", False) or not hasattr(first, "lora_A"):
        return None
    subs = [s for s in first.lora_subs if s in first.lora_A]
    if not subs:
        return None
    from rlhf_mcore.models.lora import dropout_input  # (models.lora imports this module)

    x = dropout_input(first, x)  # one mask per token row, shared by the projections (the dense column hook's rule)
    h = linear(x, torch.stack([torch.cat([lin.lora_A[s] for s in subs]) for lin in linears]))  # [T, n r]
    low = dict(zip(subs, h.chunk(len(subs), dim=-1)))
    parts = [linear(low[s], torch.stack([lin.lora_B[s] for lin in linears])) if s in low else
             x.new_zeros(x.shape[0], first.lora_local_rows[s]) for s in first.lora_subs]
    return torch.cat(parts, dim=-1) * first.lora_scale


# ---- checkpoints that store experts fused (Qwen3-VL-MoE: ModelSpec.fused_experts) ----
# transformers has no per-expert modules to name there, so peft adapts the fused parameters themselves
# (`target_parameters`), wrapping a layer's `mlp.experts` once per targeted parameter, the first listed innermost:
# with [gate_up_proj, down_proj], gate_up_proj's adapters are `mlp.experts.base_layer.lora_A/B`, down_proj's
# `mlp.experts.lora_A/B`. A fused tensor holds every expert: A [E * R, in] stacks A_e (reshape (E, R, in)),
# B [out, R * E] has B_e[:, j] at column j * E + e (reshape (out, R, E)). Our gate and up adapters (rank r each)
# are one rank-2r gate_up_proj adapter, block-diagonal (A_e = [A_gate; A_up], B_e = diag(B_gate, B_up)), with
# alpha 2 alpha for the same scale: what peft's own conversion of per-expert adapters builds.
FUSED_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
_PER_EXPERT = re.compile(r"^(?P<module>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<sub>gate_proj|up_proj|down_proj)"
                         r"\.lora_(?P<ab>[AB])\.weight$")


def stores_fused_experts(hf_config: dict) -> bool:
    """The family's checkpoints store each layer's experts fused (`ModelSpec.fused_experts`: Qwen3-VL-MoE)."""
    from rlhf_mcore.models.registry import spec_for_hf_config

    return bool(getattr(spec_for_hf_config(hf_config), "fused_experts", False))


def adapter_fuses_experts(hf_config: dict) -> bool:
    """The PEFT adapter holds peft's fused expert tensors: an MoE whose checkpoints store their experts fused."""
    return bool(text_experts(hf_config)) and stores_fused_experts(hf_config)


def fused_adapter_fields(settings) -> dict:
    """adapter_config.json's fields for fused experts: target_parameters, and gate_up_proj's rank and alpha
    (2r, 2 alpha when both gate and up are adapted: peft's patterns, its own conversion's spelling)."""
    plan = fused_params(settings.target_modules)
    fields = {"target_parameters": [f"mlp.experts.{p}" for p, _ in plan]}
    wide = {rf".*\.{p}": len(subs) for p, subs in plan if len(subs) > 1}
    if wide:
        fields["rank_pattern"] = {k: n * settings.rank for k, n in wide.items()}
        fields["alpha_pattern"] = {k: n * settings.alpha for k, n in wide.items()}
    return fields if plan else {}


def fused_params(targets) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """((fused parameter, the targeted projections it holds), ...) in peft's `target_parameters` order.

    >>> fused_params(("q_proj", "up_proj", "down_proj"))
    (('gate_up_proj', ('up_proj',)), ('down_proj', ('down_proj',)))
    """
    out = ((p, tuple(s for s in subs if s in targets)) for p, subs in FUSED_PARTS.items())
    return tuple((p, subs) for p, subs in out if subs)


def fused_key(module: str, params: tuple[str, ...], param: str, ab: str) -> str:
    """peft's saved name of adapter `ab` of fused parameter `param` of `module` (the experts), `params` targeted.

    >>> fused_key("base_model.model.m.layers.0.mlp.experts", ("gate_up_proj", "down_proj"), "gate_up_proj", "A")
    'base_model.model.m.layers.0.mlp.experts.base_layer.lora_A.weight'
    """
    return f"{module}.{'base_layer.' * (len(params) - 1 - params.index(param))}lora_{ab}.weight"


def fuse_expert_state(state: dict, targets) -> dict:
    """PEFT state with per-expert keys (`...mlp.experts.5.gate_proj.lora_A.weight`) -> peft's fused keys."""
    plan = fused_params(targets)
    params = tuple(p for p, _ in plan)
    out, groups = {}, {}
    for key, t in state.items():
        m = _PER_EXPERT.match(key)
        if m is None:
            out[key] = t
        else:
            groups.setdefault(m["module"], {})[(int(m["e"]), m["sub"], m["ab"])] = t
    for module, got in groups.items():
        experts = 1 + max(e for e, _, _ in got)
        for param, subs in plan:
            r, rows = got[(0, subs[0], "A")].shape[0], got[(0, subs[0], "B")].shape[0]
            a, b = [], []
            for e in range(experts):
                a.append(torch.cat([got[(e, s, "A")] for s in subs]))
                block = got[(e, subs[0], "B")].new_zeros(rows * len(FUSED_PARTS[param]), r * len(subs))
                for j, s in enumerate(subs):
                    k = FUSED_PARTS[param].index(s)
                    block[k * rows:(k + 1) * rows, j * r:(j + 1) * r] = got[(e, s, "B")]
                b.append(block)
            out[fused_key(module, params, param, "A")] = torch.cat(a)
            out[fused_key(module, params, param, "B")] = torch.stack(b, dim=-1).flatten(1)
    return out


def unfuse_expert_state(state: dict, targets, rank: int, num_experts: int, where: str) -> dict:
    """The inverse of `fuse_expert_state` for the fused keys in `state`; an adapter whose fused gate_up_proj is
    not block-diagonal over gate and up (trained fused) is refused."""
    params = tuple(p for p, _ in fused_params(targets))
    suffix = re.compile(r"^(?P<module>.+\.mlp\.experts)\.(?P<depth>(?:base_layer\.)*)lora_(?P<ab>[AB])\.weight$")
    out = {}
    for key, t in state.items():
        m = suffix.match(key)
        if m is None:
            out[key] = t
            continue
        param = params[len(params) - 1 - m["depth"].count("base_layer.")]
        subs = dict(fused_params(targets))[param]
        for e in range(num_experts):
            if m["ab"] == "A":
                part = t.reshape(num_experts, -1, t.shape[-1])[e]
                for j, s in enumerate(subs):
                    out[f"{m['module']}.{e}.{s}.lora_A.weight"] = part[j * rank:(j + 1) * rank]
                continue
            block = t.reshape(t.shape[0], -1, num_experts)[..., e]
            rows = t.shape[0] // len(FUSED_PARTS[param])
            kept = torch.zeros_like(block, dtype=torch.bool)
            for j, s in enumerate(subs):
                k = FUSED_PARTS[param].index(s)
                out[f"{m['module']}.{e}.{s}.lora_B.weight"] = block[k * rows:(k + 1) * rows, j * rank:(j + 1) * rank]
                kept[k * rows:(k + 1) * rows, j * rank:(j + 1) * rank] = True
            if block[~kept].any():
                raise ValueError(f"{where}: '{key}' of expert {e} is not block-diagonal over "
                                 f"{', '.join(subs)} at rank {rank}: a fused adapter trained as one cannot be split "
                                 "into ours. Start from an adapter this trainer exported, or without one.")
    return out
