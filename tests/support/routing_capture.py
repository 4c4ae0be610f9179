"""Test helper (not a test module): what every MoE router of the actor actually routed, per row and layer.

`RoutingCapture.install()` wraps the schedule's forward step and hooks the output of the actor's routers
(their routing_map [n, E]), independently of `models.routing`'s own recording: forward-only passes (the
old-log-prob pass) go to `old`, training forwards to `update` (one list entry per optimizer step). Rows are
keyed by their tokens, so they match whatever micro-batch cut or packed them. The update's reports per
optimizer step are kept too (`reports`), for the ratio of each mini-batch, and the step batch after the
forward passes (`batch`: R2's or R3's `routed_experts`, old and rollout log-probs).
"""
from __future__ import annotations

import torch

from rlhf_mcore.models.routing import from_router_order
from rlhf_mcore.trainer import phases, schedule


def row_keys(mb: dict) -> list[tuple]:
    """Each row's tokens, as a key (rows are the same sequences in every layout)."""
    tokens = from_router_order(mb["tokens"][0][:, None], mb)[..., 0] if "unpack_index" in mb else mb["tokens"]
    return [tuple(row[:n].tolist()) for row, n in zip(tokens, mb["lengths"].tolist())]


class RoutingCapture:
    def __init__(self):
        self.old: dict = {}  # row key -> {layer: bool [len, E]}
        self.update: list[dict] = []  # per optimizer step: row key -> {layer: bool [len, E]}
        self.reports: list[list] = []  # per optimizer step: the loss functions' reports
        self.current = None
        self.hooked: set[int] = set()
        self.batch = None  # the StepBatch after the forward passes
        self.by_model: dict = {}  # forward-only passes per model (the actor's old pass, the reference): id -> like old
        self.model = None

    def recorded(self) -> dict:
        """The batch's routed_experts as `old` is keyed: row key -> {layer: bool [len, E]} (position l of dim 2 is
        this rank's l-th MoE layer: PP stages hold their own)."""
        b, routed = self.batch, self.batch.routed_experts
        seen = next(iter(self.old.values()))
        layers, experts = sorted(seen), next(iter(seen.values())).size(-1)
        out = {}
        for row, n in enumerate(b.lengths.tolist()):
            key = tuple(b.tokens[row, :n].tolist())
            out[key] = {layer: torch.zeros(n, experts, dtype=torch.bool).scatter_(1, idx[:n].long(), True)
                        for layer, idx in zip(layers, routed[row].unbind(1))}
        return out

    def differ(self, used: dict, reference: dict, drop_last: bool = False) -> int:
        """Valid tokens x layers of `used` (row key -> {layer: bool [len, E]}) whose experts differ from
        `reference`'s; `drop_last`: not each row's last token."""
        bad = 0
        for key, layers in used.items():
            for layer, row in layers.items():
                end = len(key) - 1 if drop_last else len(key)
                bad += int((row[:end] != reference[key][layer][:end]).any(-1).sum())
        return bad

    def install(self, monkeypatch) -> RoutingCapture:
        original_step, original_run = schedule._forward_step, phases.run_schedule

        def forward_step(loss_fn, hooks, data_iterator, model):
            mb = next(data_iterator)
            self._hook(model)
            self.current, self.model = mb, model
            try:
                return original_step(loss_fn, hooks, iter([mb]), model)
            finally:
                self.current = self.model = None

        def run_schedule(models, micro_batches, loss_fn, forward_only, hooks=None):
            if not forward_only and hooks is not None:
                self.update.append({})
            out = original_run(models, micro_batches, loss_fn, forward_only, hooks=hooks)
            if not forward_only and hooks is not None:
                self.reports.append(out)
            return out

        original_passes = phases.forward_passes

        def forward_passes(*args, **kwargs):
            self.batch = original_passes(*args, **kwargs)
            return self.batch

        monkeypatch.setattr(schedule, "_forward_step", forward_step)
        monkeypatch.setattr(phases, "run_schedule", run_schedule)
        monkeypatch.setattr(phases, "forward_passes", forward_passes)
        return self

    def _hook(self, model) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        for router in model.modules():
            if isinstance(router, TopKRouter) and router.router_replay is not None and id(router) not in self.hooked:
                router.register_forward_hook(self._record)
                self.hooked.add(id(router))

    def _record(self, router, args, output) -> None:
        mb = self.current
        if mb is None:  # the rollout's forwards
            return
        rows = from_router_order(output[1].detach(), mb)  # [b, s, E]
        into = [self.update[-1]] if torch.is_grad_enabled() else \
            [self.old, self.by_model.setdefault(id(self.model), {})]
        for key, row in zip(row_keys(mb), rows):
            for d in into:
                d.setdefault(key, {})[router.layer_number] = row[:len(key)].clone()

    def mismatches(self) -> list[int]:
        """Per optimizer step: valid tokens x layers whose experts differ from the old pass's."""
        out = []
        for step in self.update:
            bad = 0
            for key, layers in step.items():
                for layer, used in layers.items():
                    bad += int((used != self.old[key][layer]).any(-1).sum())
            out.append(bad)
        return out

    def first_ratio(self) -> tuple[float, float]:
        """(min, max) importance ratio over the first optimizer step's micro-batches."""
        reports = self.reports[0]
        low = min(float(r["actor/ratio_min"][0]) for r in reports)
        high = max(float(r["actor/ratio_max"][0]) for r in reports)
        return low, high
