"""Experts stored fused, one 3-D tensor per layer and projection, read and written as the per-expert tensors the
weight tables name (`<P>experts.{e}.gate_proj.weight` [I, H], `up_proj` [I, H], `down_proj` [H, I]).

Qwen3-VL-MoE's checkpoints store `<P>experts.gate_up_proj` and `<P>experts.down_proj` in one of two layouts:
- the Hub's (Qwen/Qwen3-VL-30B-A3B-*; SGLang reads it and transposes): [E, H, 2I] and [E, I, H];
- transformers 5's modules (what its `save_pretrained` writes): [E, 2I, H] and [E, H, I].
The pair's shapes tell them apart: the Hub's has gate_up[1] == down[2] and gate_up[2] == 2 down[1], the modules'
gate_up[2] == down[1] and gate_up[1] == 2 down[2]; both at once would need I = 0. In both, an expert's gate rows
come before its up rows (transformers' `chunk(2, dim=-1)`, SGLang's `chunk(2, dim=-2)` after its transpose).
Exports write the Hub's layout (`fuse_experts`): SGLang and transformers both load it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping

import torch

GATE_UP, DOWN = "experts.gate_up_proj", "experts.down_proj"
PER_EXPERT = re.compile(r"^(?P<prefix>.*experts\.)(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


@dataclasses.dataclass(frozen=True)
class ExpertView:
    """Per-expert tensor = rows `rows` of expert `expert`'s matrix of fused tensor `stored` (transposed first)."""

    stored: str
    expert: int
    rows: tuple[int, int] | None  # None: all rows (down_proj)
    transpose: bool  # the Hub's layout

    def shape(self, stored_shape: tuple[int, ...]) -> tuple[int, ...]:
        rows, cols = stored_shape[1:][::-1] if self.transpose else stored_shape[1:]
        return (rows if self.rows is None else self.rows[1] - self.rows[0], cols)

    def take(self, matrix: torch.Tensor) -> torch.Tensor:
        """This view of expert `expert`'s stored matrix (`stored[expert]`)."""
        m = matrix.t() if self.transpose else matrix
        return (m if self.rows is None else m[self.rows[0]:self.rows[1]]).contiguous()


def hub_layout(gate_up: tuple[int, ...], down: tuple[int, ...], where: str) -> bool:
    """True for the Hub's layout, False for transformers' modules' (module docstring); anything else is an error.

    >>> hub_layout((4, 64, 96), (4, 48, 64), "x"), hub_layout((4, 96, 64), (4, 64, 48), "x")
    (True, False)
    """
    ok = len(gate_up) == 3 and len(down) == 3 and gate_up[0] == down[0]
    if ok and gate_up[1] == down[2] and gate_up[2] == 2 * down[1]:
        return True
    if ok and gate_up[2] == down[1] and gate_up[1] == 2 * down[2]:
        return False
    raise ValueError(f"{where}: fused experts of shapes {list(gate_up)} (gate_up_proj) and {list(down)} (down_proj) "
                     "are neither [E, H, 2I] + [E, I, H] (the Hub's) nor [E, 2I, H] + [E, H, I] (transformers'). "
                     "Use the model's own checkpoint.")


def expert_views(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, ExpertView]:
    """Per-expert name -> its view, for every fused pair among `shapes` (stored name -> shape).

    >>> v = expert_views({"m.mlp.experts.gate_up_proj": (2, 8, 12), "m.mlp.experts.down_proj": (2, 6, 8)})
    >>> sorted(v)[:3], v["m.mlp.experts.1.up_proj.weight"]
    (['m.mlp.experts.0.down_proj.weight', 'm.mlp.experts.0.gate_proj.weight', 'm.mlp.experts.0.up_proj.weight'], \
ExpertView(stored='m.mlp.experts.gate_up_proj', expert=1, rows=(6, 12), transpose=True))
    """
    views = {}
    for name, shape in shapes.items():
        if not name.endswith(GATE_UP):
            continue
        prefix = name[:-len("gate_up_proj")]
        down = prefix + "down_proj"
        if down not in shapes:
            raise ValueError(f"{name}: fused experts without their '{down}'. Use the model's own checkpoint.")
        hub = hub_layout(tuple(shape), tuple(shapes[down]), name)
        inter = (shape[2] if hub else shape[1]) // 2
        for e in range(shape[0]):
            views[f"{prefix}{e}.gate_proj.weight"] = ExpertView(name, e, (0, inter), hub)
            views[f"{prefix}{e}.up_proj.weight"] = ExpertView(name, e, (inter, 2 * inter), hub)
            views[f"{prefix}{e}.down_proj.weight"] = ExpertView(down, e, None, hub)
    return views


def fuse_experts(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert tensors -> the Hub's fused layout ([E, H, 2I], [E, I, H]), each pair where its layer's expert 0
    stood; other tensors unchanged. Every layer's experts must be complete (0..E-1, gate, up and down).

    >>> sd = {f"x.experts.{e}.{p}_proj.weight": torch.full((3, 2) if p != "down" else (2, 3), 10. * e + i)
    ...       for e in range(2) for i, p in enumerate(("gate", "up", "down"))}
    >>> out = fuse_experts(sd)
    >>> {k: list(v.shape) for k, v in out.items()}
    {'x.experts.gate_up_proj': [2, 2, 6], 'x.experts.down_proj': [2, 3, 2]}
    >>> out["x.experts.gate_up_proj"][1, 0].tolist(), out["x.experts.down_proj"][1, :, 0].tolist()
    ([10.0, 10.0, 10.0, 11.0, 11.0, 11.0], [12.0, 12.0, 12.0])
    """
    groups: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    out: dict[str, torch.Tensor | None] = {}
    for name, tensor in state_dict.items():
        m = PER_EXPERT.match(name)
        if m is None:
            out[name] = tensor
            continue
        if m["prefix"] not in groups:
            groups[m["prefix"]] = {}
            out[m["prefix"] + "gate_up_proj"] = out[m["prefix"] + "down_proj"] = None  # placed here
        groups[m["prefix"]][int(m["e"]), m["proj"]] = tensor
    for prefix, parts in groups.items():
        count = 1 + max(e for e, _ in parts)
        missing = [f"{prefix}{e}.{p}_proj.weight" for e in range(count) for p in ("gate", "up", "down")
                   if (e, p) not in parts]
        if missing:
            raise ValueError(f"fuse_experts: missing {', '.join(missing[:3])} (experts 0..{count - 1} of "
                             f"'{prefix}'). Pass every expert of the layer.")
        out[prefix + "gate_up_proj"] = torch.stack([torch.cat([parts[e, "gate"], parts[e, "up"]]).t()
                                                    for e in range(count)])
        out[prefix + "down_proj"] = torch.stack([parts[e, "down"].t() for e in range(count)])
    return out
