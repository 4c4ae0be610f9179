"""The static decoder's state (`rlhf_mcore.rollout.static_decode`): its KV cache slots, each slot's position,
input token and limit, and the response buffers the decode step writes, by response row. Every tensor is allocated
once per shape, so the captured CUDA graphs read the same memory on every replay."""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class DecodeState:
    """Everything a decode step reads or writes; dim 0 of the per-slot tensors is the cache slot."""

    k: torch.Tensor  # [L, B, G, T, D] rotated keys
    v: torch.Tensor  # [L, B, G, T, D]
    pos: torch.Tensor  # [B] long, the cache slot (= trainer column) of the token each slot feeds next
    rope_delta: torch.Tensor  # [B] long, RoPE position - cache slot of the slot's tokens (M-RoPE past images; 0)
    tokens_in: torch.Tensor  # [B] long, the token each slot feeds to the next step
    done: torch.Tensor  # [B] bool
    limit: torch.Tensor  # [B] long, the response tokens the slot's row may have (it ends at that length)
    slot_row: torch.Tensor  # [B] long, the response row each slot writes (rows >= R: scratch of idle slots)
    out_tokens: torch.Tensor  # [R + B, N] long, by response row; a row's next column is its length
    out_logprobs: torch.Tensor  # [R + B, N] fp32
    out_lengths: torch.Tensor  # [R + B] long
    out_stopped: torch.Tensor  # [R + B] bool

    @classmethod
    def allocate(cls, num_layers, batch, groups, length, head_dim, max_new, dtype, device,
                 rows: int = 0) -> "DecodeState":
        """batch cache slots; response buffers for max(rows, batch) rows plus a scratch row per slot."""
        def z(*shape, dt=torch.long):
            return torch.zeros(*shape, dtype=dt, device=device)
        out = max(rows, batch) + batch
        return cls(k=z(num_layers, batch, groups, length, head_dim, dt=dtype),
                   v=z(num_layers, batch, groups, length, head_dim, dt=dtype),
                   pos=z(batch), rope_delta=z(batch), tokens_in=z(batch), done=z(batch, dt=torch.bool),
                   limit=z(batch),
                   slot_row=z(batch), out_tokens=z(out, max_new),
                   out_logprobs=z(out, max_new, dt=torch.float32), out_lengths=z(out),
                   out_stopped=z(out, dt=torch.bool))

    @property
    def num_rows(self) -> int:
        """Response rows a call may use (the rest are the idle slots' scratch rows)."""
        return self.out_tokens.size(0) - self.done.numel()

    def idle(self, start: int, stop: int) -> None:
        """Slots [start, stop) decode nothing real: done, writing scratch rows of their own (never a real
        row, so no two slots write one row in a step), at cache slot 0 and RoPE position 0 (a delta left by an
        earlier row, M-RoPE's negative one, would index the RoPE table at -1)."""
        self.done[start:stop] = True
        self.pos[start:stop] = 0
        self.rope_delta[start:stop] = 0
        self.slot_row[start:stop] = self.num_rows + torch.arange(start, stop, device=self.done.device)

    def idle_slots(self, slots: torch.Tensor) -> None:
        """`idle` for scattered slots ([k] long): their rows ended and were read, so their buffer rows may go to
        other slots, which these must no longer write."""
        self.done[slots] = True
        self.pos[slots] = 0
        self.rope_delta[slots] = 0
        self.slot_row[slots] = self.num_rows + slots

    def fits(self, batch: int, length: int, max_new: int, rows: int = 0) -> bool:
        return (self.k.size(1) >= batch and self.k.size(3) >= length and self.out_tokens.size(1) >= max_new
                and self.num_rows >= rows)

    def start(self, slots, rows: torch.Tensor, limits: torch.Tensor) -> None:
        """Slots `slots` (a slice or [k] long) begin response rows `rows` ([k] long), each ending at `limits`."""
        self.done[slots] = False
        self.slot_row[slots] = rows
        self.limit[slots] = limits
        self.out_lengths[rows] = 0
        self.out_stopped[rows] = False

    def compact(self, keep: torch.Tensor, bucket: int) -> None:
        """Move slots `keep` ([n] long) to the front (cache rows too) and idle the rest of the new bucket;
        response buffers stay by row."""
        n = keep.numel()
        self.k[:, :n] = self.k[:, keep]
        self.v[:, :n] = self.v[:, keep]
        for t in (self.pos, self.rope_delta, self.tokens_in, self.done, self.limit, self.slot_row):
            t[:n] = t[keep]
        self.idle(n, bucket)
