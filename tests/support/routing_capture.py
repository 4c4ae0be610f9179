"""Test helper (not a test module): what every MoE router of the actor actually routed, per row and layer.

`RoutingCapture.install()` wraps the schedule's forward step and hooks the output of the actor's routers
(their routing_map [n, E]), independently of `models.routing`'s own recording: forward-only passes (the
old-log-prob pass) go to `old`, training forwards to `update` (one list entry per optimizer step). Rows are
keyed by their tokens, so they match whatever micro-batch cut or packed them. The update's reports per
optimizer step are kept too (`reports`), for the ratio of each mini-batch.
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

    def install(self, monkeypatch) -> RoutingCapture:
        original_step, original_run = schedule._forward_step, phases.run_schedule

        def forward_step(loss_fn, hooks, data_iterator, model):
            mb = next(data_iterator)
            self._hook(model)
            self.current = mb
            try:
                return original_step(loss_fn, hooks, iter([mb]), model)
            finally:
                self.current = None

        def run_schedule(models, micro_batches, loss_fn, forward_only, hooks=None):
            if not forward_only and hooks is not None:
                self.update.append({})
            out = original_run(models, micro_batches, loss_fn, forward_only, hooks=hooks)
            if not forward_only and hooks is not None:
                self.reports.append(out)
            return out

        monkeypatch.setattr(schedule, "_forward_step", forward_step)
        monkeypatch.setattr(phases, "run_schedule", run_schedule)
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
        into = self.update[-1] if torch.is_grad_enabled() else self.old
        for key, row in zip(row_keys(mb), rows):
            into.setdefault(key, {})[router.layer_number] = row[:len(key)].clone()

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
