"""LoRA adapters on megatron's tensor-parallel linears: the ONE build-time model transform (`apply_lora`, called
by `models.build.build_model` for the trainable roles), the effective weights every consumer reads
(`lora_delta`, `effective_weight`), and the reference policy as the actor with its adapters off
(`adapters_disabled`, `AdaptersOff`).

y = W x + scale * B (A dropout(x)), scale = alpha / rank, on `linear_qkv` (q_proj, k_proj, v_proj), `linear_proj`
(o_proj), `linear_fc1` (gate_proj, up_proj) and `linear_fc2` (down_proj). The adapters are parameters of the
wrapped linear itself, `lora_A.<sub>` / `lora_B.<sub>` (<sub> the HF projection name), so the base keys, the
weight maps and the checkpoint layout stay megatron's. Per TP rank:
- column-parallel (qkv, fc1): A_<sub> [r, in] replicated; B_<sub> [out_sub / tp, r], this rank's rows of that
  sub-projection. h = A x on the (replicated) input goes through `copy_to_tensor_model_parallel_region`
  (identity forward, all-reduce backward) before B: A's gradient is the full sum, the same on every TP rank.
  The sub-projections' outputs are laid out as the fused weight's rows (`spec.join_fused`: per query group
  [q; k; v], [gate; up]).
- row-parallel (proj, fc2): A [r, in / tp], this rank's columns; B [out, r] replicated.
  h = reduce_from_tensor_model_parallel_region(A x_local) (all-reduce forward), y += B h.
Under sequence parallelism the column input is gathered (its gradient split back, not summed: it is complete
on every rank) and the row branch reduce-scatters h; B's gradient is then partial per rank and megatron sums
it over TP (`sequence_parallel` attribute, `finalize_model_grads`).

B starts at zero (the model is the base, bitwise); A is drawn from a seed fixed by the global layer number and
the sub-projection (kaiming-uniform as PEFT), then sliced: the same adapters at every TP/PP layout. Only
adapters train (a scalar head, new for a critic, trains too); the base is frozen. Dropout hits the LoRA
input only, in training forwards with gradients (log-prob passes are deterministic). MoE expert MLPs get
the same adapters per expert (`models.lora_experts`: expert TP 1, expert-parallel).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Iterator

import torch

from rlhf_mcore.config.checks import LORA_MEGATRON_TARGETS, LORA_TARGETS
from rlhf_mcore.models.lora_experts import attach_expert_adapters
from rlhf_mcore.models.roles import role_spec
from rlhf_mcore.models.spec import join_fused

log = logging.getLogger(__name__)

LORA_SEED = 4_200_007
ALL_LINEAR = "all-linear"
# HF projection -> (megatron linear, fused layout of its sub-projections or None)
TARGETS: dict[str, tuple[str, str | None]] = {
    "q_proj": ("linear_qkv", "qkv"), "k_proj": ("linear_qkv", "qkv"), "v_proj": ("linear_qkv", "qkv"),
    "o_proj": ("linear_proj", None),
    "gate_proj": ("linear_fc1", "gate_up"), "up_proj": ("linear_fc1", "gate_up"),
    "down_proj": ("linear_fc2", None),
}
SUBS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
        "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}
assert tuple(TARGETS) == LORA_TARGETS and tuple(SUBS) == LORA_MEGATRON_TARGETS  # the config's names (validated)
COLUMN = ("linear_qkv", "linear_fc1")  # column-parallel (output split over TP); the others are row-parallel


def expand_targets(names, key: str = "model.target_modules") -> tuple[str, ...]:
    """`all-linear`, HF projection names or megatron's linear names (Megatron-Bridge's, which verl's megatron
    LoRA and slime use: linear_qkv, linear_proj, linear_fc1, linear_fc2) -> the HF names, in TARGETS order;
    unknown names raise.

    >>> expand_targets(["all-linear"])[:3], expand_targets(["v_proj", "q_proj"])
    (('q_proj', 'k_proj', 'v_proj'), ('q_proj', 'v_proj'))
    >>> expand_targets(["linear_qkv", "linear_fc2"])
    ('q_proj', 'k_proj', 'v_proj', 'down_proj')
    """
    from rlhf_mcore.registry import suggest

    names = [names] if isinstance(names, str) else list(names)
    if ALL_LINEAR in names:
        return tuple(TARGETS)
    bad = [n for n in names if n not in TARGETS and n not in SUBS]
    if bad or not names:
        hint = suggest(bad[0], [*TARGETS, *SUBS, ALL_LINEAR]) if bad else ""
        raise ValueError(f"{key}: unknown module name {bad[0] if bad else '(none)'!r} (got {names}).{hint} "
                         f"Use {ALL_LINEAR}, a list of {', '.join(TARGETS)}, or megatron's {', '.join(SUBS)}.")
    wanted = {sub for n in names for sub in SUBS.get(n, (n,))}
    return tuple(t for t in TARGETS if t in wanted)


@dataclasses.dataclass(frozen=True, slots=True)
class LoraSettings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # HF projection names (expanded)
    dropout: float = 0.0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_model_cfg(cls, model_cfg, rank: int | None = None) -> "LoraSettings | None":
        """None when LoRA is off (model.lora_rank=0); `rank` overrides model.lora_rank (critic.lora_rank)."""
        rank = getattr(model_cfg, "lora_rank", 0) if rank is None else rank
        if not rank:
            return None
        return cls(rank=rank, alpha=float(model_cfg.lora_alpha), dropout=float(model_cfg.lora_dropout),
                   target_modules=expand_targets(model_cfg.target_modules))

    def describe(self) -> dict:
        """What a checkpoint records (a resume with other settings is refused)."""
        return {"rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules),
                "dropout": self.dropout}


def _linears(model) -> Iterator[tuple[object, str, object]]:
    """(transformer layer, megatron linear name, module) of this stage's dense projections."""
    for layer in model.decoder.layers:
        yield layer, "linear_qkv", layer.self_attention.linear_qkv
        yield layer, "linear_proj", layer.self_attention.linear_proj
        for name in ("linear_fc1", "linear_fc2"):
            if hasattr(layer.mlp, name):  # MoE layers have experts instead (models.lora_experts)
                yield layer, name, getattr(layer.mlp, name)


def _sub_shapes(tc, name: str) -> dict[str, tuple[int, int]]:
    """Full (TP1) (out, in) of each sub-projection of a megatron linear."""
    q = tc.num_attention_heads * tc.kv_channels
    kv = (tc.num_query_groups or tc.num_attention_heads) * tc.kv_channels
    h, ffn = tc.hidden_size, tc.ffn_hidden_size
    return {"linear_qkv": {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h)},
            "linear_proj": {"o_proj": (h, q)},
            "linear_fc1": {"gate_proj": (ffn, h), "up_proj": (ffn, h)},
            "linear_fc2": {"down_proj": (h, ffn)}}[name]


def _init_a(rank: int, fan_in: int, layer_number: int, sub: str, salt: int = 0) -> torch.Tensor:
    """Full A [rank, fan_in]: kaiming-uniform(a=sqrt(5)) as PEFT, from a seed of the global layer and sub (and
    `salt`: an expert's)."""
    gen = torch.Generator().manual_seed(LORA_SEED + 16 * layer_number + list(TARGETS).index(sub) + salt)
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(rank, fan_in, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).float()


def _param(t: torch.Tensor, like: torch.Tensor, split_dim: int | None, sp_sum: bool = False,
           expert: bool = False):
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    p = torch.nn.Parameter(t.to(device=like.device, dtype=like.dtype).contiguous())
    if expert:  # as megatron's expert weights: TP-tagged over the (size-1) expert TP group, never all-reduced
        set_tensor_model_parallel_attributes(p, True, 0 if split_dim is None else split_dim, 1)
        p.allreduce = False
        return p
    set_tensor_model_parallel_attributes(p, split_dim is not None, -1 if split_dim is None else split_dim, 1)
    if sp_sum:
        p.sequence_parallel = True  # replicated, but each TP rank sees only its sequence chunk: sum over TP
    return p


@dataclasses.dataclass(frozen=True, slots=True)
class _Where:
    """Where a linear's adapters live: its TP rank, size and group (an expert's: 0, 1 and the expert TP group)."""
    tp_rank: int
    tp_size: int
    tp_group: object
    expert: bool = False


def _attach(linear, name: str, subs: tuple[str, ...], settings: LoraSettings, tc, layer_number: int,
            where: _Where, shapes: dict | None = None, salt: int = 0) -> None:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    column = name in COLUMN
    if type(linear) not in (ColumnParallelLinear, RowParallelLinear):
        raise ValueError(f"model.lora_rank: LoRA adapts megatron's local linears, not {type(linear).__name__} "
                         f"(got model.lora_rank={settings.rank}). Set model.attention_backend=sdpa.")
    if column and linear.gather_output:
        raise ValueError(f"LoRA: {name} gathers its output; only megatron's layer layout (no gather) is supported.")
    tp_rank, tp_size, expert = where.tp_rank, where.tp_size, where.expert
    sp = bool(linear.sequence_parallel) and not expert  # experts see routed tokens, not a sequence
    shapes = shapes or _sub_shapes(tc, name)
    linear.lora_A, linear.lora_B = torch.nn.ParameterDict(), torch.nn.ParameterDict()
    for sub in subs:
        out, fan_in = shapes[sub]
        a = _init_a(settings.rank, fan_in, layer_number, sub, salt)
        if column:  # A replicated, B this rank's rows of the sub-projection
            linear.lora_A[sub] = _param(a, linear.weight, None, expert=expert)
            linear.lora_B[sub] = _param(torch.zeros(out // tp_size, settings.rank), linear.weight, 0, expert=expert)
        else:  # A this rank's input columns, B replicated
            local = fan_in // tp_size
            linear.lora_A[sub] = _param(a[:, tp_rank * local:(tp_rank + 1) * local], linear.weight, 1,
                                        expert=expert)
            linear.lora_B[sub] = _param(torch.zeros(out, settings.rank), linear.weight, None, sp_sum=sp,
                                        expert=expert)
    linear.lora_column, linear.lora_sp, linear.lora_expert = column, sp, expert
    linear.lora_subs = SUBS[name]  # every sub-projection of the fused output, adapted or not
    linear.lora_fuse = TARGETS[SUBS[name][0]][1]
    linear.lora_groups = (tc.num_query_groups or tc.num_attention_heads) // tp_size
    linear.lora_local_rows = {s: o // (tp_size if column else 1) for s, (o, _) in shapes.items()}
    linear.lora_scale, linear.lora_enabled = settings.scale, True
    linear.lora_dropout = settings.dropout
    linear.lora_tp_group = where.tp_group
    linear.register_forward_hook(_column_hook if column else _row_hook, with_kwargs=True)
    linear.sharded_state_dict = _sharded_state_dict.__get__(linear)


def apply_lora(model, settings: LoraSettings | None, ctx) -> object:
    """Attach adapters to `model` (a GPTModel chunk, this rank's stage) in place and freeze its base. Returns
    the model. A critic's scalar head (new, `RoleSpec.fresh_head`) stays trainable."""
    if settings is None:
        return model
    tc = model.config
    model.requires_grad_(False)
    wanted = set(settings.target_modules)
    dense = _Where(ctx.tp_rank, ctx.dims.tp, ctx.pgs.tp)
    for layer, name, linear in _linears(model):
        subs = tuple(s for s in SUBS[name] if s in wanted)
        if subs:
            _attach(linear, name, subs, settings, tc, layer.layer_number, dense)
    attach_expert_adapters(model, settings, lambda linear, name, subs, shapes, layer_number, salt: _attach(
        linear, name, subs, settings, tc, layer_number, _Where(0, 1, linear.tp_group, expert=True), shapes, salt))
    role = getattr(model, "role", "actor")
    if role_spec(role).fresh_head and getattr(model, "post_process", False):
        model.output_layer.requires_grad_(True)
    model.lora_settings = settings
    return model


def is_lora_model(model) -> bool:
    return getattr(model, "lora_settings", None) is not None


def is_adapter_name(name: str) -> bool:
    """An adapter's parameter / state-dict key (`...linear_qkv.lora_A.q_proj`)."""
    return ".lora_A." in name or ".lora_B." in name or name.startswith(("lora_A.", "lora_B."))


def adapter_parameters(model) -> Iterator[tuple[str, torch.nn.Parameter]]:
    return ((n, p) for n, p in model.named_parameters() if is_adapter_name(n))


def trainable_names(model) -> set[str]:
    """State-dict keys a LoRA model trains and checkpoints: the adapters (+ a critic's head)."""
    return {n for n, p in model.named_parameters() if p.requires_grad}


def lora_linears(model) -> Iterator[object]:
    return (m for m in model.modules() if hasattr(m, "lora_A"))


@contextlib.contextmanager
def adapters_disabled(model):
    """Forward runs as the frozen base model (the reference policy is the actor with its adapters off)."""
    linears = list(lora_linears(model))
    before = [m.lora_enabled for m in linears]
    for m in linears:
        m.lora_enabled = False
    try:
        yield model
    finally:
        for m, flag in zip(linears, before):
            m.lora_enabled = flag


class AdaptersOff(torch.nn.Module):
    """The reference policy as a view of the LoRA actor: forward under `adapters_disabled`. Holds no parameters
    (the actor is not a child); any other attribute is the actor's, so megatron's schedules and the log-prob
    code see the actor (`set_input_tensor`, `config`, the output weight)."""

    def __init__(self, model):
        super().__init__()
        object.__setattr__(self, "module", model)
        self.role = "ref"

    def forward(self, *args, **kwargs):
        with adapters_disabled(self.module):
            return self.module(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["module"], name)


def _sub_weight(linear, sub: str) -> torch.Tensor | None:
    """scale * B_sub @ A_sub in fp32 ([out_sub_local, in_local]), None when the sub is not adapted."""
    if sub not in linear.lora_A:
        return None
    return (linear.lora_B[sub].float() @ linear.lora_A[sub].float()) * linear.lora_scale


def lora_delta(linear) -> torch.Tensor | None:
    """This rank's effective weight delta in megatron's local layout (same shape and dtype as linear.weight),
    or None when the linear has no adapters."""
    if not hasattr(linear, "lora_A"):
        return None
    parts = [_sub_weight(linear, s) for s in linear.lora_subs]
    if linear.lora_fuse is None:
        (delta,) = parts
    else:
        cols = linear.weight.shape[1]
        parts = [p if p is not None else torch.zeros(linear.lora_local_rows[s], cols, device=linear.weight.device)
                 for p, s in zip(parts, linear.lora_subs)]
        delta = join_fused(linear.lora_fuse, parts, linear.lora_groups)
    return delta.to(linear.weight.dtype)


def effective_weight(linear) -> torch.Tensor:
    delta = lora_delta(linear)
    return linear.weight if delta is None else linear.weight + delta


def dropout_input(linear, x: torch.Tensor) -> torch.Tensor:
    """x with model.lora_dropout applied (training forwards with gradients only): the adapters' input."""
    if linear.lora_dropout and linear.training and torch.is_grad_enabled():
        return torch.nn.functional.dropout(x, p=linear.lora_dropout)
    return x


def _column_hook(linear, args, kwargs, output):
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    if not linear.lora_enabled:
        return output
    x = args[0] if args else kwargs["input_"]  # [s(/tp), b, in], replicated over TP
    group = linear.lora_tp_group
    if linear.lora_sp:  # the base gathers the sequence itself; the LoRA gradient is complete: split it
        x = gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False, group=group)
    x = dropout_input(linear, x)
    subs = [s for s in linear.lora_subs if s in linear.lora_A]
    a = torch.cat([linear.lora_A[s] for s in subs])  # [n * r, in]
    h = copy_to_tensor_model_parallel_region(torch.matmul(x, a.t()), group=group)  # [s, b, n * r]
    hs = dict(zip(subs, h.chunk(len(subs), dim=-1)))
    parts = [torch.matmul(hs[s], linear.lora_B[s].t()) if s in hs else
             h.new_zeros(*h.shape[:-1], linear.lora_local_rows[s]) for s in linear.lora_subs]
    y = parts[0] if len(parts) == 1 else join_fused(
        linear.lora_fuse, [p.movedim(-1, 0) for p in parts], linear.lora_groups).movedim(0, -1)
    out, bias = output
    return out + y * linear.lora_scale, bias


def _row_hook(linear, args, kwargs, output):
    from megatron.core.tensor_parallel.mappings import (
        reduce_from_tensor_model_parallel_region,
        reduce_scatter_to_sequence_parallel_region,
    )

    if not linear.lora_enabled:
        return output
    x = dropout_input(linear, args[0] if args else kwargs["input_"])  # [s, b, in / tp]
    (sub,) = linear.lora_subs
    u = torch.matmul(x, linear.lora_A[sub].t())  # [s, b, r], a partial sum over TP
    group = linear.lora_tp_group
    h = reduce_scatter_to_sequence_parallel_region(u, group=group) if linear.lora_sp else \
        reduce_from_tensor_model_parallel_region(u, group=group)
    out, bias = output
    return out + torch.matmul(h, linear.lora_B[sub].t()) * linear.lora_scale, bias


def _sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
    """megatron's sharded state dict of the linear, with the adapters split along their own TP axis."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    axes = {"weight": 0, "bias": 0} if self.lora_column else {"weight": 1}
    for kind in ("lora_A", "lora_B"):
        for sub, p in getattr(self, kind).items():
            if getattr(p, "tensor_model_parallel", False):
                axes[f"{kind}.{sub}"] = p.partition_dim
    return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, axes,
                                               sharded_offsets, tp_group=self.tp_group,
                                               dp_cp_group=metadata["dp_cp_group"])


def checkpointed_state(model) -> tuple[dict, list[str]]:
    """(the sharded state dict a training checkpoint holds, the state-dict names it leaves out). A LoRA model
    saves and resumes its trainable parameters only (adapters, a critic's head): the base comes from
    model.hf_path / model.load at start, as in the first run."""
    sharded = model.sharded_state_dict()
    if not is_lora_model(model):
        return sharded, []
    keep = trainable_names(model)
    return {k: v for k, v in sharded.items() if k in keep}, [k for k in model.state_dict() if k not in keep]


def base_state(model) -> tuple[dict, list[str]]:
    """(the sharded state dict without adapters, the adapter names): what a base checkpoint (model.load) fills."""
    sharded = model.sharded_state_dict()
    return {k: v for k, v in sharded.items() if not is_adapter_name(k)}, [k for k in sharded if is_adapter_name(k)]
