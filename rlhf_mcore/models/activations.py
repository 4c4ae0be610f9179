"""config.json `hidden_act` -> the MLP activation megatron runs (`TransformerConfig.activation_func`).

Every family's MLP is gated (HF `down(act(gate(x)) * up(x))`, megatron `gated_linear_unit`), so the activation
is the only thing `hidden_act` changes: SwiGLU for `silu`, GeGLU for the GELU family. Each entry is the very
formula transformers' `ACT2FN` computes (same ops, same order), so logits match transformers to rounding.
`fusable`: megatron's fused bias-activation kernel computes exactly this function (`bias_activation_fusion`, on
GPU): only SwiGLU; its fused GeGLU is the tanh approximation, so an exact-erf `gelu` runs unfused.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from rlhf_mcore.registry import Registry


class Activation(NamedTuple):
    fn: Callable[[torch.Tensor], torch.Tensor]
    fusable: bool = False  # megatron's bias_activation_fusion computes this function


ACTIVATIONS: Registry[Activation] = Registry("hidden_act")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """transformers `gelu_pytorch_tanh`: torch's tanh-approximate GELU kernel."""
    return F.gelu(x, approximate="tanh")


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers `gelu_new` / `gelu_accurate` (GPT-2's GELU), written out as transformers writes it.

    >>> round(gelu_new(torch.tensor([1.0])).item(), 6)
    0.841192
    """
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """transformers `gelu_fast`: the tanh approximation with a rounded constant."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers `quick_gelu`: x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


for _names, _activation in ((("silu", "swish"), Activation(F.silu, fusable=True)),
                            (("gelu",), Activation(F.gelu)),  # exact (erf)
                            (("gelu_pytorch_tanh",), Activation(gelu_tanh)),
                            (("gelu_new", "gelu_accurate"), Activation(gelu_new)),
                            (("gelu_fast",), Activation(gelu_fast)),
                            (("quick_gelu",), Activation(quick_gelu)),
                            (("relu",), Activation(F.relu))):
    for _name in _names:
        ACTIVATIONS.register(_name)(_activation)


def activation_for(hf: dict) -> Activation:
    """The activation of config.json's `hidden_act` (default silu); an unknown name raises (`activation_error`)."""
    return ACTIVATIONS.get(hf.get("hidden_act") or "silu")


def activation_error(hf: dict, source: str) -> str | None:
    """One line naming `hidden_act` when it has no entry, else None.

    >>> activation_error({"hidden_act": "gelu_new"}, "c.json") is None
    True
    """
    name = hf.get("hidden_act") or "silu"
    if name in ACTIVATIONS:
        return None
    return (f"{source}: hidden_act {name!r} is not supported (field hidden_act). Use one of "
            f"{', '.join(sorted(ACTIVATIONS))}.")
