"""MoE routing, per token: record it, replay it, count it (`actor.router_replay`, the `moe/*` metrics).

megatron-core's router (0.16.1, `transformer/moe/router_replay.py`) holds a `RouterReplay` per layer when
`moe_enable_routing_replay` is set (models.build sets it for the actor): action RECORD keeps the top-k expert
indices [n, k] of its last forward, REPLAY_FORWARD routes to given indices (their probabilities gathered from
this forward's scores, so gradients still flow through the router). We reach each layer's instance through
the model's own modules, never megatron's process-wide list, and clear every action after each schedule run.

The router sees a micro-batch's tokens in its own order: [s, b] flattened (s-major) for padded rows, the
packed order [T] for packed ones, and only this TP rank's 1/tp of either under sequence parallelism. The
step keeps routing in the row layout instead, `routed_experts` [B, S, L, k] (token t of row i, this rank's
L MoE layers), so a replay does not depend on how the update's micro-batches cut or pack the rows:
`to_router_order` / `from_router_order` convert one micro-batch between the two. Positions the record never
saw (padding) hold experts 0..k-1; they are never a valid token.
"""
from __future__ import annotations

import torch

from rlhf_mcore.data.packing import is_packed


def moe_routers(module) -> list:
    """The MoE routers of one model chunk that carry a RouterReplay, by layer number (empty: dense, or a
    role built without replay)."""
    from megatron.core.transformer.moe.router import TopKRouter

    found = [m for m in module.modules() if isinstance(m, TopKRouter) and m.router_replay is not None]
    return sorted(found, key=lambda r: r.layer_number)


def index_dtype(num_experts: int) -> torch.dtype:
    """uint8 up to 256 experts (NCCL and gloo have no int16), else int32."""
    return torch.uint8 if num_experts <= 256 else torch.int32


def num_router_tokens(mb: dict) -> int:
    """Tokens one forward of `mb` routes, over all TP ranks (s * b padded, T packed)."""
    return mb["tokens"].numel()


def to_router_order(rows: torch.Tensor, mb: dict) -> torch.Tensor:
    """Row layout [b, s, ...] of micro-batch `mb` -> the router's token order [n, ...] (n = num_router_tokens)."""
    if not is_packed(mb):
        return rows.transpose(0, 1).reshape(-1, *rows.shape[2:])
    index = mb["unpack_index"]  # [n_rows, W], T where a row has no token
    total = mb["tokens"].size(1)
    width = min(index.size(1), rows.size(1))
    out = default_indices(total + 1, rows.shape[2:], rows.dtype, rows.device)
    out[index[:, :width]] = rows[:, :width]  # the T slots all land on the dropped extra row
    return out[:total]


def from_router_order(flat: torch.Tensor, mb: dict) -> torch.Tensor:
    """The router's token order [n, ...] -> row layout [b, s, ...] of micro-batch `mb` (padding: 0..k-1)."""
    if not is_packed(mb):
        b, s = mb["tokens"].shape
        return flat.reshape(s, b, *flat.shape[1:]).transpose(0, 1)
    pad = default_indices(1, flat.shape[1:], flat.dtype, flat.device)
    return torch.cat([flat, pad])[mb["unpack_index"]]


def valid_router_tokens(mb: dict) -> torch.Tensor:
    """[n] bool in the router's order: a real token of a row (not padding, not the packed tail)."""
    if is_packed(mb):
        total = mb["tokens"].size(1)
        valid = torch.zeros(total + 1, dtype=torch.bool, device=mb["tokens"].device)
        valid[mb["unpack_index"]] = True
        return valid[:total]
    b, s = mb["tokens"].shape
    pos = torch.arange(s, device=mb["tokens"].device)
    return (pos[:, None] < mb["lengths"][None, :]).reshape(-1)


def default_indices(n: int, tail: tuple, dtype, device) -> torch.Tensor:
    """[n, *tail] filled with experts 0..k-1 along the last dim (k = tail[-1])."""
    k = tail[-1]
    return torch.arange(k, device=device).to(dtype).expand(n, *tail).clone()


def pad_columns(rows: torch.Tensor, width: int) -> torch.Tensor:
    """[B, S, ..., k] -> [B, width, ..., k]: the columns past S hold experts 0..k-1 (padding).

    >>> pad_columns(torch.tensor([[[3, 1]]]), 2).tolist()
    [[[3, 1], [0, 1]]]
    """
    b, extra = rows.size(0), width - rows.size(1)
    pad = default_indices(b * extra, rows.shape[2:], rows.dtype, rows.device).view(b, extra, *rows.shape[2:])
    return torch.cat([rows, pad], dim=1)


def sp_slice(flat: torch.Tensor, router) -> torch.Tensor:
    """This TP rank's share of the router order under sequence parallelism (all of it otherwise)."""
    if not router.config.sequence_parallel:
        return flat
    size, rank = router.tp_group.size(), router.tp_group.rank()
    per = flat.size(0) // size
    return flat[rank * per:(rank + 1) * per]


def sp_gather(local: torch.Tensor, router) -> torch.Tensor:
    """The whole router order from each TP rank's share (sequence parallelism), in rank order."""
    if not router.config.sequence_parallel or router.tp_group.size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(router.tp_group.size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=router.tp_group)
    return torch.cat(parts)


def expert_counts(indices: torch.Tensor, valid: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[E] float64: how many valid tokens picked each expert among their top-k. indices [n, k], valid [n].

    >>> expert_counts(torch.tensor([[0, 1], [1, 2], [3, 0]]), torch.tensor([True, True, False]), 4).tolist()
    [1.0, 2.0, 1.0, 0.0]
    """
    picked = indices[valid].reshape(-1).long()
    return torch.bincount(picked, minlength=num_experts).double()


class RoutingHooks:
    """Per-micro-batch hooks of the schedule's forward step (`schedule.run_schedule(hooks=...)`) for one model:
    - record: keep each micro-batch's routing at its rows of `routed_experts` [B, S, L, k] (`recorded`);
    - replay: route every micro-batch to its rows of mb["routed_experts"] (REPLAY_FORWARD);
    - always: count the valid tokens each expert got, per global layer (`counts` [num_layers, E], this rank).
    Without replay the routers record (which only keeps a reference to their indices) so they can be counted.
    `close()` clears the routers' actions and indices: a later forward (e.g. the rollout's) routes normally."""

    def __init__(self, chunks: list, replay: bool = False, record_shape: tuple[int, int] | None = None):
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.actions = RouterReplayAction
        self.routers = {id(c): moe_routers(c) for c in chunks}
        ordered = sorted((r for rs in self.routers.values() for r in rs), key=lambda r: r.layer_number)
        self.position = {id(r): i for i, r in enumerate(ordered)}  # this rank's layer index (routed_experts dim 2)
        first = ordered[0]
        self.num_experts, self.topk = first.config.num_moe_experts, first.topk
        self.counts = torch.zeros(first.config.num_layers, self.num_experts, dtype=torch.float64,
                                  device=first.weight.device)
        self.replay, self.forwards = replay, 0
        self.recorded = None
        if record_shape is not None:
            self.recorded = default_indices(record_shape[0], (record_shape[1], len(ordered), self.topk),
                                            index_dtype(self.num_experts), first.weight.device)

    @classmethod
    def for_model(cls, chunks: list, **kwargs) -> RoutingHooks | None:
        """None unless the model has MoE routers built with replay (the actor of an MoE model)."""
        return cls(chunks, **kwargs) if any(moe_routers(c) for c in chunks) else None

    def before(self, chunk, mb: dict) -> None:
        rows = mb.get("routed_experts") if self.replay else None
        if self.replay and rows is None:
            raise KeyError("routed_experts: router replay needs the recorded routing in every micro-batch")
        for router in self.routers.get(id(chunk), []):
            replay = router.router_replay
            if rows is None:
                replay.set_router_replay_action(self.actions.RECORD)
                continue
            replay.set_router_replay_action(self.actions.REPLAY_FORWARD)
            target = to_router_order(rows[:, :, self.position[id(router)]], mb)
            replay.target_topk_idx = sp_slice(target, router).long()

    def after(self, chunk, mb: dict) -> None:
        routers = self.routers.get(id(chunk), [])
        if not routers:
            return
        self.forwards += 1
        valid = valid_router_tokens(mb)
        for router in routers:
            replay = router.router_replay
            if self.replay:
                used = to_router_order(mb["routed_experts"][:, :, self.position[id(router)]], mb)
            else:
                used = sp_gather(replay.recorded_topk_idx.detach(), router)
            self.counts[router.layer_number - 1] += expert_counts(used, valid, self.num_experts)
            if self.recorded is not None:
                rows = from_router_order(used.to(self.recorded.dtype), mb)  # [b, s, k]
                self.recorded[mb["row_index"], :rows.size(1), self.position[id(router)]] = rows
            replay.recorded_topk_idx = None

    def __enter__(self) -> RoutingHooks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for routers in self.routers.values():
            for router in routers:
                router.router_replay.clear_router_replay_action()
                router.router_replay.clear_indices()
