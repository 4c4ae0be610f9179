"""Rollout routing replay (R3, `actor.router_replay=R3`): the native engine's eager decode records the top-k
experts every MoE router of this rank chose for each row's prompt and response tokens, in the trainer's row
layout `routed_experts` [B, S, L, k] (`models.routing`), so every trainer pass over the batch replays exactly
the experts the sampler used.

The recording rides on megatron's RouterReplay (action RECORD keeps a router's last top-k [n, k]; the actor is
built with it) and reads it after each forward of a chunk:
- the prefill: left-padded prompts [b, P], the router's order [P, b] (s-major); row i's prompt token c sits at
  position P - len_i + c, i.e. the valid positions in row-major order are the prompt columns in order;
- decode step s >= 1: one token per cache slot [b'], slot j holding chunk row slots[j]; the running rows feed
  their response token s - 1, trainer column len_i + s - 1 (finished rows still in the cache feed padding).
The last response token is never fed back to the sampler, so its routing is not known: it keeps experts
0..k-1, like padding. Nothing depends on it (the log-prob of a token comes from the positions before it).

Indices are global expert ids (EP: the router scores every expert on every rank); each PP stage records its
own layers, so `routed_experts` is per rank, like R2's. TP ranks route identical tokens (no sequence
parallelism in the native engine), so they record identical indices.
"""
from __future__ import annotations

import torch

from rlhf_mcore.models.routing import default_indices, index_dtype, moe_routers, pad_columns


class RolloutRouting:
    """Records one chunk of rows at a time: `start`, then `prefill` after the prompt forward and `decode` after
    each decode forward, then `rows()` (each row's [len_i + n_i, L, k]); `close()` leaves the routers routing
    normally. Use as a context manager around the chunk."""

    def __init__(self, routers: list):
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.routers, self.actions = routers, RouterReplayAction
        first = routers[0]
        self.topk, self.dtype = first.topk, index_dtype(first.config.num_moe_experts)
        self.buffer = None  # [b, P + max_new, L, k]
        self.lengths = None  # [b] prompt lengths

    @classmethod
    def for_model(cls, model) -> RolloutRouting | None:
        """None for a model (stage) without MoE routers built with replay."""
        routers = moe_routers(model)
        return cls(routers) if routers else None

    def start(self, lengths: torch.Tensor, width: int) -> RolloutRouting:
        """A chunk of rows with prompt lengths `lengths` [b], `width` = longest prompt + max_new columns."""
        self.lengths = lengths
        self.buffer = default_indices(lengths.numel(), (width, len(self.routers), self.topk), self.dtype,
                                      lengths.device)
        for router in self.routers:
            router.router_replay.set_router_replay_action(self.actions.RECORD)
        return self

    def __enter__(self) -> RolloutRouting:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for router in self.routers:
            router.router_replay.clear_router_replay_action()
            router.router_replay.clear_indices()

    def _taken(self) -> list[torch.Tensor]:
        """Each router's top-k of the last forward [n, k], and the record dropped (no reference kept)."""
        out = []
        for router in self.routers:
            out.append(router.router_replay.recorded_topk_idx.detach().to(self.dtype))
            router.router_replay.recorded_topk_idx = None
        return out

    def after_forward(self, step: int, valid: torch.Tensor, slots: torch.Tensor, alive: torch.Tensor) -> None:
        """After forward `step` of the chunk: the prefill (0) or a decode step."""
        if step == 0:
            self.prefill(valid)
        else:
            self.decode(step, slots, alive)

    def prefill(self, valid: torch.Tensor) -> None:
        """After the prompt forward: valid [b, P] bool, False on the left padding."""
        b, width = valid.shape
        columns = torch.arange(width, device=valid.device)[None] < self.lengths[:, None]  # [b, P] prompt columns
        for layer, top in enumerate(self._taken()):
            rows = top.view(width, b, -1).transpose(0, 1)  # [b, P, k]
            self.buffer[:, :width, layer][columns] = rows[valid]

    def decode(self, step: int, slots: torch.Tensor, alive: torch.Tensor) -> None:
        """After decode forward `step` (>= 1) over the cache slots: slots [b'] chunk row per slot, alive [b']
        bool the slots that fed a real token (response token step - 1)."""
        rows = slots[alive]
        cols = self.lengths[rows] + step - 1
        for layer, top in enumerate(self._taken()):
            self.buffer[rows, cols, layer] = top[alive]

    def rows(self, response_lengths: list[int]) -> list[torch.Tensor]:
        """Row i's routing [len_i + n_i, L, k] (n_i: its response length)."""
        prompt = self.lengths.tolist()
        return [self.buffer[i, :p + n] for i, (p, n) in enumerate(zip(prompt, response_lengths))]


def stack_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-row routings [n_i, L, k] -> [B, width, L, k], padded with experts 0..k-1.

    >>> stack_rows([torch.tensor([[[3, 1]]]), torch.zeros(0, 1, 2, dtype=torch.long)], 2)[:, :, 0].tolist()
    [[[3, 1], [0, 1]], [[0, 1], [0, 1]]]
    """
    return torch.stack([pad_columns(r[None], width)[0] for r in rows])
