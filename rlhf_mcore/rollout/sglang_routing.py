"""Rollout routing replay (R3) through SGLang: each request's routed experts, as SGLang returns them, in the
layout the native recorder produces (`routing_record`), so every trainer pass replays the sampler's experts.

What SGLang does (0.5.x, `sglang.srt.layers.moe.routed_experts_capturer` and, later, `state_capturer/`): started
with `enable_return_routed_experts=True`, every forward writes each MoE layer's top-k (`topk_ids` as the router
chose them, logical = global expert ids, before any EP remapping) into a host buffer indexed by KV-cache slot, for
every forward whether or not a request asked (so a prompt prefilled earlier into the prefix cache keeps the experts
of that prefill). A request sent with `return_routed_experts=True` gets, when it finishes,
`meta_info["routed_experts"]`: base64 of an int32 array [seqlen - 1, num_hidden_layers, top_k], seqlen = prompt +
output tokens. Row t is token t's routing (prompt tokens first, then response tokens); the last output token is
never fed back, so it has none. Layers are indexed by the HF layer id (0-based, all layers of the model: SGLang
holds the whole model on each GPU, inference TP = 1). slime / miles read the same field for their R3.

Ours: a row's routing is [prompt + response tokens, L, k] over the MoE layers of this rank's PP stage (megatron's
router `layer_number` is the 1-based global layer), the index dtype of `models.routing`, and the row's last token
holds experts 0..k-1 as in the native recorder. The rows are converted with all the model's layers where they are
generated (any rank of the replica) and cut to this rank's layers after the replica's results are gathered.
"""
from __future__ import annotations

import base64

import numpy as np
import torch

from rlhf_mcore.models.routing import default_indices, index_dtype, moe_routers
from rlhf_mcore.models.spec import num_experts


def decode_routed_experts(value, num_layers: int, topk: int) -> torch.Tensor:
    """SGLang's meta_info["routed_experts"] -> int32 [n, num_layers, topk]: base64 of int32 (its HTTP and Engine
    output), or already an array / tensor / nested list (a future SGLang returning the tensor itself).

    >>> raw = np.arange(8, dtype=np.int32).tobytes()
    >>> decode_routed_experts(base64.b64encode(raw).decode(), num_layers=2, topk=2).tolist()
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    """
    if isinstance(value, (str, bytes)):
        flat = torch.from_numpy(np.frombuffer(base64.b64decode(value), dtype=np.int32).copy())
    else:
        flat = torch.as_tensor(np.asarray(value)).to(torch.int32)
    per_token = num_layers * topk
    if flat.numel() % per_token:
        raise ValueError(f"sglang routed_experts: {flat.numel()} expert ids are not a whole number of tokens of "
                         f"{num_layers} layers x top-{topk}; the engine's model does not match the actor's")
    return flat.reshape(-1, num_layers, topk)


def row_routing(flat: torch.Tensor, prompt_len: int, num_tokens: int, num_experts: int) -> torch.Tensor:
    """One request's [seqlen - 1, layers, k] -> [prompt_len + num_tokens, layers, k] in the index dtype: the
    first prompt_len + num_tokens - 1 fed tokens (a response cut at a stop string keeps its prefix), then the
    row's last token at experts 0..k-1.

    >>> flat = torch.tensor([[[3, 1]], [[2, 0]], [[1, 3]], [[0, 2]]], dtype=torch.int32)  # 3 prompt + 2 output - 1
    >>> row_routing(flat, prompt_len=3, num_tokens=2, num_experts=4)[:, 0].tolist()
    [[3, 1], [2, 0], [1, 3], [0, 2], [0, 1]]
    >>> row_routing(flat, prompt_len=3, num_tokens=1, num_experts=4)[:, 0].tolist()  # cut after one token
    [[3, 1], [2, 0], [1, 3], [0, 1]]
    """
    fed = prompt_len + num_tokens - 1
    if flat.size(0) < fed:
        raise RuntimeError(f"sglang routed_experts: {flat.size(0)} tokens of routing for a row that fed {fed} "
                           f"({prompt_len} prompt + {num_tokens} response - 1); the replay would misalign")
    if fed and not 0 <= int(flat[:fed].min()) <= int(flat[:fed].max()) < num_experts:
        raise RuntimeError(f"sglang routed_experts: expert ids outside 0..{num_experts - 1}")
    dtype = index_dtype(num_experts)
    last = default_indices(1, flat.shape[1:], dtype, flat.device)
    return torch.cat([flat[:fed].to(dtype), last])


class SGLangRouting:
    """The model's routing shape (all HF layers, top-k, experts: the same on every rank, which may generate rows for
    any rank of its replica) and this rank's MoE layers among them (empty on a stage without MoE routers)."""

    def __init__(self, num_layers: int, topk: int, num_experts: int, layers: list[int]):
        self.num_layers, self.topk, self.num_experts, self.layers = num_layers, topk, num_experts, layers

    @classmethod
    def for_model(cls, model, hf_config: dict) -> SGLangRouting:
        """From the HF config (a vision LM's LM fields: under text_config), and the layers of this rank's routers
        (megatron's 1-based global layer_number)."""
        from rlhf_mcore.models.families.vision_family import text_config

        hf_config = text_config(hf_config)
        return cls(hf_config["num_hidden_layers"], hf_config["num_experts_per_tok"], num_experts(hf_config),
                   [r.layer_number - 1 for r in moe_routers(model)])

    def row(self, out: dict, prompt_len: int, num_tokens: int) -> torch.Tensor:
        """A finished request's routing, all layers: [prompt_len + num_tokens, num_layers, k] (CPU)."""
        value = out["meta_info"].get("routed_experts")
        if value is None:
            raise RuntimeError("sglang rollout: no meta_info['routed_experts'] in a request's output with "
                               "actor.router_replay=R3; the engine was not started with "
                               "enable_return_routed_experts=True or the request did not ask for it")
        flat = decode_routed_experts(value, self.num_layers, self.topk)
        return row_routing(flat, prompt_len, num_tokens, self.num_experts)

    def this_rank(self, routing: torch.Tensor) -> torch.Tensor | None:
        """A row's routing over all layers -> over this rank's MoE layers [n, L, k] (None: no MoE layer here)."""
        return routing[:, self.layers] if self.layers else None
