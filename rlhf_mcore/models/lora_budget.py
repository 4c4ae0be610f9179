"""What LoRA trains and what it saves, as arithmetic over the HF config (no model is built): the start-up log
(`trainer.roles`) and `python -m rlhf_mcore.diagnose` print it.

Saved per GPU (the model split over tp x pp):
- the reference model: with LoRA the reference is the actor with its adapters off (`models.lora.AdaptersOff`),
  so its copy of the weights (params x bytes) is not allocated;
- optimizer state and gradients of the frozen base: megatron's DDP and optimizer hold only parameters that
  require grad, i.e. per frozen parameter an fp32 grad buffer (4 B), Adam's two fp32 moments (8 B) and, in
  bf16, an fp32 master copy (4 B); the optimizer part is divided by dp with the distributed optimizer.
"""
from __future__ import annotations

import dataclasses

HF_SHAPES = {"q_proj": ("q", "h"), "k_proj": ("kv", "h"), "v_proj": ("kv", "h"), "o_proj": ("h", "q"),
             "gate_proj": ("ffn", "h"), "up_proj": ("ffn", "h"), "down_proj": ("h", "ffn")}  # (out, in)
MLP = ("gate_proj", "up_proj", "down_proj")
GIB = 2**30


def lora_param_count(dims: dict, rank: int, targets, moe: bool = False) -> int:
    """Adapter parameters of the whole model: rank x (in + out) per adapted projection and layer; an MoE
    layer's MLP projections once per expert (`models.lora_experts`), at the experts' width (moe_ffn, Mixtral's
    ffn).

    >>> dims = {"layers": 2, "h": 64, "q": 64, "kv": 32, "ffn": 128, "experts": 4, "moe_ffn": 16}
    >>> lora_param_count(dims, 8, ["q_proj", "v_proj"]), lora_param_count(dims, 8, ["down_proj"], moe=True)
    (3584, 5120)
    """
    if moe:
        dims = {**dims, "ffn": dims.get("moe_ffn") or dims["ffn"]}
    per_layer = sum(rank * (dims[HF_SHAPES[t][0]] + dims[HF_SHAPES[t][1]]) * (dims["experts"] if moe and t in MLP
                                                                             else 1) for t in targets)
    return per_layer * dims["layers"]


@dataclasses.dataclass(frozen=True, slots=True)
class LoraBudget:
    trainable: int  # adapter parameters (whole model)
    total: int  # base parameters (whole model)
    ref_bytes: int  # per GPU: the reference copy not allocated (0 when a reference is not needed or separate)
    optim_bytes: int  # per GPU: grads + optimizer state of the frozen base not allocated

    @property
    def fraction(self) -> float:
        return self.trainable / max(1, self.total)


def lora_budget(hf: dict, settings, dtype: str, tp: int = 1, pp: int = 1, dp: int = 1,
                distributed_optimizer: bool = False, ref_shared: bool = True) -> LoraBudget:
    from rlhf_mcore.models.families.vision_family import text_config
    from rlhf_mcore.models.full_weights import num_params
    from rlhf_mcore.models.spec import num_experts
    from rlhf_mcore.models.weights import model_dims

    hf = text_config(hf)  # a vision LM's config.json nests its LM's fields (the budget counts the LM)
    dims = model_dims(hf, "config.json")
    trainable = lora_param_count(dims, settings.rank, settings.target_modules, moe=bool(num_experts(hf)))
    total = num_params(hf)
    shard = tp * pp
    bf16 = dtype == "bf16"
    optim_per_param = (8 + (4 if bf16 else 0)) / (dp if distributed_optimizer else 1)
    frozen = total / shard
    return LoraBudget(trainable=trainable, total=total,
                      ref_bytes=int(frozen * (2 if bf16 else 4)) if ref_shared else 0,
                      optim_bytes=int(frozen * (4 + optim_per_param)))


def describe(budget: LoraBudget, settings, ref: str) -> str:
    """One line: rank, trainable share, and where the memory goes. `ref`: 'shared' (the actor without
    adapters), 'separate' (ref.load), or 'none' (no KL: no reference at all)."""
    def fmt(n: int) -> str:
        return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"

    targets = "all-linear" if len(settings.target_modules) == len(HF_SHAPES) else ",".join(settings.target_modules)
    line = (f"lora: rank {settings.rank}, alpha {settings.alpha:g} on {targets}: {fmt(budget.trainable)} trainable "
            f"params ({100 * budget.fraction:.2f}% of {fmt(budget.total)}), base frozen; grads + optimizer state "
            f"for adapters only (saves {budget.optim_bytes / GIB:.3f} GiB per GPU)")
    if ref == "shared":
        line += f"; reference = actor without adapters (saves {budget.ref_bytes / GIB:.3f} GiB per GPU)"
    elif ref == "separate":
        line += "; reference = its own model (ref.load)"
    return line
