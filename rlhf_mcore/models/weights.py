"""HF <-> megatron-core weight conversion: pure functions over state dicts, driven by the weight-map table of
each family (`ModelSpec.weights`, models/families/).

The megatron side is the full (TP1/PP1) state dict of a `GPTModel` built with the local layer spec
(`rlhf_mcore.models.build`); dist-checkpointing reshards it to any TP/PP on load. Per table row:

- `copy`: the same tensor under another name;
- `qkv`: q/k/v projections fused per query group: for each of the `ng` groups, its `nh/ng` query heads,
  then its key head, then its value head (megatron's GQA layout, so a TP split keeps whole groups);
- `gate_up`: [gate; up] concatenated (SwiGLU `linear_fc1`);
- `vocab`: rows padded with zeros up to a multiple of `make_vocab_size_divisible_by` (dropped on export).

Heads: actor / ref carry `lm_head.weight` <-> `output_layer.weight` (absent when embeddings are tied);
critic / reward carry HF `score.weight` [1, hidden] (`*ForSequenceClassification`) <-> `output_layer.weight`
(`ScalarHead`). A critic converted from a causal LM has no value head yet: the key is left out and the model
keeps its own initialisation.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import torch

from rlhf_mcore.models.activations import activation_error
from rlhf_mcore.models.registry import ModelSpec, spec_for_hf_config
from rlhf_mcore.models.roles import ROLES, role_spec  # noqa: F401  (ROLES: the names, for callers)
from rlhf_mcore.models.spec import WeightRule, join_fused, num_experts  # noqa: F401  (join_fused: callers)
from rlhf_mcore.models.transformer_config import padded_vocab_size

LM_HEAD = WeightRule("output_layer.weight", ("lm_head.weight",), (("vocab", "h"),), "vocab")
SCORE_HEAD = WeightRule("output_layer.weight", ("score.weight",), (("one", "h"),))

IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved


def weight_table(spec: ModelSpec, hf_config: dict) -> tuple[WeightRule, ...]:
    """The family's table (its `ModelSpec.weights`) and the rows this config.json adds (`optional_weights`)."""
    return spec.weights + spec.optional_weights(hf_config)


def default_role(hf_config: dict) -> str:
    """'reward' for an HF `*ForSequenceClassification` config, else 'actor'."""
    archs = hf_config.get("architectures") or []
    return "reward" if any(a.endswith("ForSequenceClassification") for a in archs) else "actor"


def model_dims(hf_config: dict, source: str) -> dict[str, int]:
    """Symbolic dimension -> size, after checking every config field the weights depend on."""
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if not isinstance(hf_config.get(key), int) or hf_config[key] <= 0:
            raise ValueError(f"{source}: config field '{key}' is missing or not a positive int "
                             f"(got {hf_config.get(key)!r}).")
    if activation_error(hf_config, source):  # the weights convert, but no model could run them
        raise ValueError(activation_error(hf_config, source))
    heads = hf_config["num_attention_heads"]
    groups = hf_config.get("num_key_value_heads") or heads
    if heads % groups:
        raise ValueError(f"{source}: config field 'num_key_value_heads'={groups} does not divide "
                         f"num_attention_heads={heads}.")
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    return {"layers": hf_config["num_hidden_layers"], "h": hf_config["hidden_size"],
            "ffn": hf_config["intermediate_size"], "vocab": hf_config["vocab_size"], "groups": groups,
            "q": heads * head_dim, "kv": groups * head_dim, "d": head_dim, "one": 1,
            "experts": num_experts(hf_config), "moe_ffn": hf_config.get("moe_intermediate_size") or 0}


def rules_for(hf_config: dict, role: str, source: str) -> list[WeightRule]:
    """The family table with layer indices filled in, plus the head of `role`."""
    lm_head = role_spec(role).lm_head
    spec = spec_for_hf_config(hf_config, source)
    spec.check(hf_config, source)
    rules = []
    for rule in weight_table(spec, hf_config):
        indices = range(hf_config["num_hidden_layers"]) if "{i}" in rule.mcore else [None]
        experts = range(num_experts(hf_config)) if "{e}" in rule.mcore else [None]  # MoE: one row per expert
        for i in indices:
            for e in experts:
                rules.append(dataclasses.replace(rule, mcore=rule.mcore.format(i=i, e=e),
                                                 hf=tuple(k.format(i=i, e=e) for k in rule.hf)))
    if not lm_head:
        rules.append(SCORE_HEAD)
    elif not hf_config.get("tie_word_embeddings", False):
        rules.append(LM_HEAD)
    return rules


def _shape(symbols: tuple[str, ...], dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(dims[s] for s in symbols)


def _join(rule: WeightRule, tensors: list[torch.Tensor], dims: dict[str, int], divisible_by: int):
    if rule.fuse in ("qkv", "gate_up"):
        return join_fused(rule.fuse, tensors, dims["groups"])
    if rule.fuse == "vocab":
        (t,) = tensors
        pad = padded_vocab_size(t.shape[0], divisible_by) - t.shape[0]
        return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
    return tensors[0]


def _split(rule: WeightRule, tensor: torch.Tensor, dims: dict[str, int]) -> list[torch.Tensor]:
    shapes = [_shape(s, dims) for s in rule.shapes]
    if rule.fuse == "qkv":
        per_group = tensor.reshape(dims["groups"], -1, *tensor.shape[1:])
        parts = per_group.split([s[0] // dims["groups"] for s in shapes], dim=1)
        return [p.reshape(s).clone() for p, s in zip(parts, shapes)]
    if rule.fuse == "gate_up":
        return [p.clone() for p in tensor.split([s[0] for s in shapes], dim=0)]
    if rule.fuse == "vocab":
        return [tensor[: dims["vocab"]].clone()]
    return [tensor]


def _fused_shape(rule: WeightRule, dims: dict[str, int]) -> tuple[int, ...] | None:
    """Expected megatron shape (None for vocab rows: any padding >= vocab is accepted)."""
    shapes = [_shape(s, dims) for s in rule.shapes]
    if rule.fuse in ("qkv", "gate_up"):
        return (sum(s[0] for s in shapes), *shapes[0][1:])
    return None if rule.fuse == "vocab" else shapes[0]


def _take(hf_sd: dict, key: str, expected: tuple[int, ...], mcore_key: str, source: str) -> torch.Tensor:
    if key not in hf_sd:
        hint = " A reward model needs a *ForSequenceClassification checkpoint." if "score" in key else ""
        raise ValueError(f"{source}: missing tensor '{key}' (for megatron '{mcore_key}').{hint}")
    if tuple(hf_sd[key].shape) != expected:
        hint = " The scalar head has one output: num_labels must be 1." if key == "score.weight" else ""
        raise ValueError(f"{source}: tensor '{key}' has shape {list(hf_sd[key].shape)}, expected "
                         f"{list(expected)} from the config.{hint}")
    return hf_sd[key]


def _check_leftovers(keys: set[str], source: str, kind: str) -> None:
    keys = {k for k in keys if not k.endswith(IGNORED_HF_SUFFIXES) and not k.endswith("._extra_state")}
    if keys:
        listed = ", ".join(sorted(keys)[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
        raise ValueError(f"{source}: unexpected {kind} tensor(s) {listed}. Is this checkpoint of the "
                         "architecture and role its config.json names?")


def hf_to_mcore(hf_sd: Mapping[str, torch.Tensor], hf_config: dict, *, role: str | None = None,
                divisible_by: int = 128, source: str = "HF state dict",
                only: set[str] | None = None) -> dict[str, torch.Tensor]:
    """HF state dict -> megatron full (TP1/PP1) state dict for `role` (default: from the architecture).
    `only`: convert just these megatron keys (one pipeline stage); the other HF tensors are never read. A vision
    model's tower tensors (its family's `vision_prefix`) are left to `convert.vision_weights`."""
    role = role or default_role(hf_config)
    spec = spec_for_hf_config(hf_config, source)
    hf_config = spec.text_config(hf_config)  # a vision-language config.json nests the LM's fields
    dims = model_dims(hf_config, source)
    used, out = {k for k in hf_sd if spec.vision_prefix and k.startswith(spec.vision_prefix)}, {}
    for rule in rules_for(hf_config, role, source):
        if only is not None and rule.mcore not in only:
            used.update(rule.hf)
            continue
        if rule is SCORE_HEAD and "score.weight" not in hf_sd and role_spec(role).fresh_head:
            continue  # critic from a causal LM: the value head keeps its initialisation
        tensors = [_take(hf_sd, key, _shape(symbols, dims), rule.mcore, source)
                   for key, symbols in zip(rule.hf, rule.shapes)]
        out[rule.mcore] = _join(rule, tensors, dims, divisible_by)
        used.update(rule.hf)
    if hf_config.get("tie_word_embeddings") and "lm_head.weight" in hf_sd and role_spec(role).lm_head:
        if not torch.equal(hf_sd["lm_head.weight"], hf_sd["model.embed_tokens.weight"]):
            raise ValueError(f"{source}: tie_word_embeddings is true but tensor 'lm_head.weight' differs "
                             "from 'model.embed_tokens.weight'. Set tie_word_embeddings=false.")
        used.add("lm_head.weight")
    if not role_spec(role).lm_head:
        used.add("lm_head.weight")  # a causal LM's vocabulary head has no place in a scalar-head model
    _check_leftovers(set(hf_sd) - used, source, "HF")
    return out


def mcore_to_hf(mcore_sd: dict[str, torch.Tensor], hf_config: dict, *, role: str | None = None,
                source: str = "megatron state dict") -> dict[str, torch.Tensor]:
    """Megatron full (TP1/PP1) state dict -> HF state dict; vocab padding is dropped."""
    return dict(iter_mcore_to_hf(mcore_sd, hf_config, role=role, source=source))


def iter_mcore_to_hf(mcore_sd: dict[str, torch.Tensor], hf_config: dict, *, role: str | None = None,
                     source: str = "megatron state dict") -> Iterator[tuple[str, torch.Tensor]]:
    """`mcore_to_hf` one (HF name, tensor) at a time: split / trimmed tensors are made only as they are
    consumed (a weight refresh in buckets holds one bucket of copies, not the whole model)."""
    role = role or default_role(hf_config)
    hf_config = spec_for_hf_config(hf_config, source).text_config(hf_config)  # a VL config nests the LM's fields
    dims = model_dims(hf_config, source)
    rules = rules_for(hf_config, role, source)
    leftovers = set(mcore_sd) - {r.mcore for r in rules}
    if hf_config.get("tie_word_embeddings") and role_spec(role).lm_head:
        leftovers.discard("output_layer.weight")  # a last pipeline stage's copy of the tied embedding
    _check_leftovers(leftovers, source, "megatron")
    for rule in rules:
        if rule.mcore not in mcore_sd:
            raise ValueError(f"{source}: missing tensor '{rule.mcore}' (for HF {', '.join(rule.hf)}).")
        tensor = mcore_sd[rule.mcore]
        expected = _fused_shape(rule, dims)
        rows_ok = rule.fuse != "vocab" or (tensor.dim() == 2 and tensor.shape[0] >= dims["vocab"]
                                           and tensor.shape[1] == dims["h"])
        if (expected is not None and tuple(tensor.shape) != expected) or not rows_ok:
            want = list(expected) if expected is not None else f"[>={dims['vocab']}, {dims['h']}]"
            raise ValueError(f"{source}: tensor '{rule.mcore}' has shape {list(tensor.shape)}, "
                             f"expected {want} from the HF config.")
        yield from zip(rule.hf, _split(rule, tensor, dims))
