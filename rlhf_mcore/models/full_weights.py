"""The actor's full weights on every rank, from any TP/PP training layout: what a rollout engine that keeps
its own copy of the model (one per GPU) consumes after each update.

`FullWeights(model, ctx)` is a read-only mapping from full-model megatron keys (the TP1/PP1 names of
`models.weights`) to full tensors. Reading one entry is collective over the model-parallel group (every
TP and PP rank of the replica reads the same keys in the same order):

- the stage that holds the tensor gathers its TP shards (`tp_join`, megatron's partition layout);
- an MoE expert lives on one rank of its stage's expert-parallel group (global expert index = ep_rank x
  local count + local index, megatron's `local_expert_indices`), which broadcasts it over that group; experts
  are never split over TP (parallel.etp=1), so this is the read at every TP / PP / EP layout;
- it broadcasts the full tensor to the other pipeline stages.

With parallel.ep > 1 the reads are collective over the ranks of the expert-parallel groups too (every rank
of the run when it reads, as the rollout engines do).

With LoRA adapters (`models.lora`) an entry is the effective weight W + (alpha / r) B @ A of its linear
(merged on the owning stage, per TP shard, before the gather), and the adapter parameters are not entries:
every consumer (the SGLang weight sync, the HF export) gets merged weights under the base model's keys.

Nothing is cached, so a consumer that converts and sends tensors as it reads them (`hf_weights`, then
buckets) holds one bucket plus the tensor being converted. At TP = PP = 1 an entry is the parameter
itself (no copy). `bytes_received` counts what came over the TP, EP and PP groups on this rank.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Iterator

import torch
import torch.distributed as dist

from rlhf_mcore.models.vision import TOWER_NAME

_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERTS = "mlp.experts.local_experts."
_EXPERT_KEY = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.")
GATE_UP = ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias")  # gated MLP: each TP rank holds [gate_r; up_r]


def unwrap_model(model):
    """The GPTModel inside DDP / Float16Module wrappers (a single chunk: no virtual pipeline)."""
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise ValueError(f"rollout: expected one model chunk (got {len(model)}). Virtual pipeline "
                             "parallelism is not supported by the rollout engines.")
        model = model[0]
    while hasattr(model, "module"):
        model = model.module
    return model


def global_key(model, key: str) -> str:
    """Local pipeline-stage key -> key in the full model (layer indices are per stage, expert indices per EP rank)."""
    match = _LAYER_KEY.match(key)
    if match is None:
        return key
    layer = model.decoder.layers[int(match.group(1))]
    rest = key[match.end():]
    expert = _EXPERT_KEY.match(rest)
    if expert is not None:  # MoE under expert parallelism: this rank's experts are numbered from 0
        rest = f"{_EXPERTS}{layer.mlp.local_expert_indices[int(expert.group(1))]}." + rest[expert.end():]
    return f"decoder.layers.{layer.layer_number - 1}." + rest


def tp_join(shards: list[torch.Tensor], partition_dim: int, key: str) -> torch.Tensor:
    """The full tensor from its TP shards in rank order (inverse of megatron's split).

    >>> full = torch.arange(8.).reshape(4, 2)  # gate rows 0-1, up rows 2-3
    >>> tp_join([full[[0, 2]], full[[1, 3]]], 0, "decoder.layers.0.mlp.linear_fc1.weight").equal(full)
    True
    """
    if len(shards) == 1:
        return shards[0]
    if key.endswith(GATE_UP):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=partition_dim)


def is_expert(key: str) -> bool:
    """An MoE expert's parameter (megatron SequentialMLP), local or full key.

    >>> is_expert("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"), is_expert("mlp.router.weight")
    (True, False)
    """
    return _EXPERTS in key


def partition_dim(param, key: str = "") -> int:
    """The dimension megatron splits `param` (named `key`) along over TP, or -1 when every TP rank holds all of
    it; experts are whole on their rank (expert TP = 1: parallel.etp), though megatron tags them TP-parallel."""
    if is_expert(key):
        return -1
    return param.partition_dim if getattr(param, "tensor_model_parallel", False) else -1


def tp_split(full: torch.Tensor, partition_dim: int, key: str, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's part of a full tensor (megatron's split; `tp_join` is its inverse; -1: not split).

    >>> full = torch.arange(8.).reshape(4, 2)
    >>> key = "decoder.layers.0.mlp.linear_fc1.weight"
    >>> tp_join([tp_split(full, 0, key, r, 2) for r in range(2)], 0, key).equal(full)
    True
    """
    if tp_size == 1 or partition_dim < 0:
        return full
    if key.endswith(GATE_UP):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])
    return full.chunk(tp_size, dim=partition_dim)[tp_rank]


def merged_linears(model) -> tuple[set[str], dict[str, object]]:
    """(local names of the LoRA adapter parameters, local weight key -> its linear) of a model with adapters
    (`models.lora`); (set(), {}) for one without."""
    from rlhf_mcore.models.lora_export import adapter_entries, split_adapter_name

    if not any(split_adapter_name(name) for name, _ in model.named_parameters()):
        return set(), {}
    adapters, linears = set(), {}
    for linear_path, ab, sub, _ in adapter_entries(model):
        adapters.add(f"{linear_path}.lora_{ab}.{sub}")
        linears[f"{linear_path}.weight"] = model.get_submodule(linear_path)
    return adapters, linears


def _listing(model, skip: set[str] = frozenset()) -> dict[str, tuple]:
    """This rank's parameters but `skip`: full key -> (local key, local shape, dtype, TP partition dim or -1)."""
    out = {}
    for key, param in model.named_parameters():
        if key in skip:
            continue
        out.setdefault(global_key(model, key), (key, tuple(param.shape), param.dtype, partition_dim(param, key)))
    return out


def plan_from_listings(listings: list[list[dict[str, tuple]]], tp: int) -> dict[str, tuple]:
    """Full key -> (owner stage, owner EP rank, full shape, dtype, partition dim), from each stage's listings
    (one per EP rank, in rank order) in stage order. A key on several stages (a tied output copy) belongs to
    the first, a key on several EP ranks (everything but the experts) to the first. Keys in model order.

    >>> plan_from_listings([[{"a": ("a", (2, 3), torch.float32, 1)}], [{"b": ("b", (4,), torch.float32, -1)}]], tp=2)
    {'a': (0, 0, (2, 6), torch.float32, 1), 'b': (1, 0, (4,), torch.float32, -1)}
    >>> e = [{"x": ("x", (1,), torch.float32, -1), f"e{r}": ("e0", (1,), torch.float32, -1)} for r in (0, 1)]
    >>> [(k, v[1]) for k, v in plan_from_listings([e], tp=1).items()]
    [('x', 0), ('e0', 0), ('e1', 1)]
    """
    plan = {}
    for stage, per_ep in enumerate(listings):
        for ep_rank, listing in enumerate(per_ep):
            for key, (_, shape, dtype, dim) in listing.items():
                if key not in plan:
                    full = tuple(n * tp if i == dim else n for i, n in enumerate(shape))
                    plan[key] = (stage, ep_rank, full, dtype, dim)
    return plan


def _gather_objects(obj, size: int, group) -> list:
    if size == 1:
        return [obj]
    out = [None] * size
    dist.all_gather_object(out, obj, group=group)
    return out


class FullWeights(Mapping):
    """Full-model key -> full tensor on this rank's device; every read is collective (module doc)."""

    def __init__(self, model, ctx):
        self.model, self.ctx = unwrap_model(model), ctx
        adapters, self.linears = merged_linears(self.model)  # LoRA: weight key -> linear to merge
        # a trained vision tower is whole on every rank, and named apart (`rollout.sglang_images.tower_tensors`)
        tower = {k for k, _ in self.model.named_parameters() if k.startswith(TOWER_NAME + ".")}
        self.params = {k: p for k, p in self.model.named_parameters() if k not in adapters | tower}
        listing = _listing(self.model, adapters | tower)
        self.local = {key: entry[0] for key, entry in listing.items()}
        per_ep = _gather_objects(listing, ctx.dims.ep, ctx.pgs.ep)  # this stage's EP ranks hold other experts
        self.plan = plan_from_listings(_gather_objects(per_ep, ctx.dims.pp, ctx.pgs.pp), ctx.dims.tp)
        self.ep_rank = dist.get_group_rank(ctx.pgs.ep, dist.get_rank()) if ctx.dims.ep > 1 else 0
        self.bytes_received = 0

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[str]:
        return iter(self.plan)

    def __contains__(self, key) -> bool:  # Mapping's default would read (and gather) the entry
        return key in self.plan

    @torch.no_grad()
    def __getitem__(self, key: str) -> torch.Tensor:
        stage, ep_owner, shape, dtype, dim = self.plan[key]
        ctx = self.ctx
        if ctx.pp_rank == stage and key in self.local:
            full = self._tp_gather(self._local(self.local[key]), dim, key)
        else:
            full = torch.empty(shape, dtype=dtype, device=ctx.device)
        if ctx.pp_rank == stage and ctx.dims.ep > 1 and is_expert(key):  # one rank of the EP group holds it
            dist.broadcast(full, src=dist.get_global_rank(ctx.pgs.ep, ep_owner), group=ctx.pgs.ep)
            if self.ep_rank != ep_owner:
                self.bytes_received += full.numel() * full.element_size()
        if ctx.dims.pp > 1:
            dist.broadcast(full, src=dist.get_process_group_ranks(ctx.pgs.pp)[stage], group=ctx.pgs.pp)
            if ctx.pp_rank != stage:
                self.bytes_received += full.numel() * full.element_size()
        return full

    def _local(self, local_key: str) -> torch.Tensor:
        """This rank's shard of an entry: the parameter, or its linear's effective (merged) weight."""
        linear = self.linears.get(local_key)
        if linear is None:
            return self.params[local_key].detach()
        from rlhf_mcore.models.lora import effective_weight

        return effective_weight(linear).detach()

    def _tp_gather(self, local: torch.Tensor, dim: int, key: str) -> torch.Tensor:
        tp = self.ctx.dims.tp
        if tp == 1 or dim < 0:
            return local
        shards = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(shards, local.contiguous(), group=self.ctx.pgs.tp)
        self.bytes_received += (tp - 1) * local.numel() * local.element_size()
        return tp_join(shards, dim, key)


def hf_weights(full: Mapping, hf_config: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's weights under HF names, one tensor at a time (collective when `full` is `FullWeights`)."""
    from rlhf_mcore.models.weights import iter_mcore_to_hf

    return iter_mcore_to_hf(full, hf_config, role="actor", source="actor weights")


def num_params(hf_config: dict) -> int:
    """Parameters of the actor as an HF model (the converter's weight table; no vocab padding)."""
    from rlhf_mcore.models.weights import model_dims, rules_for

    dims = model_dims(hf_config, "config.json")
    return sum(math.prod(dims[symbol] for symbol in shape)
               for rule in rules_for(hf_config, "actor", "config.json") for shape in rule.shapes)


def kv_bytes_per_token(hf_config: dict, bytes_per_value: int) -> int:
    """KV cache bytes one token takes over all layers (keys and values).

    >>> kv_bytes_per_token({"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
    ...                     "num_key_value_heads": 2}, 2)
    12288
    """
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    groups = hf_config.get("num_key_value_heads") or heads
    return 2 * hf_config["num_hidden_layers"] * groups * head_dim * bytes_per_value
