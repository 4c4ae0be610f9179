"""Cross-section rules, checked before any process group or model exists. Each rule is a few lines and
returns error strings of the form "<dotted.key>: <problem> (got <value>). <fix>."."""
from __future__ import annotations

import json
import os

from rlhf_mcore.config import Config

# Estimators that compare the samples of one prompt: they need rollout.n >= 2.
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "gpg",
                    "optimal_token_baseline", "tir_optimal_token_baseline")
# Estimators that need sum_v pi(v)^2 of the old policy (computed with the old log-probs).
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
# Estimators that need critic values (a critic is built and trained for them).
VALUE_ESTIMATORS = ("gae",)
# Estimators whose baseline is the reward of a greedy rollout of the same prompt (generated each step).
GREEDY_BASELINE_ESTIMATORS = ("remax",)
REQUIRED_INLINE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")


def _model_shape(cfg: Config) -> tuple[dict | None, list[str]]:
    """(hf-style dict of the architecture, errors about where it comes from)."""
    m = cfg.model
    inline_set = [k for k in REQUIRED_INLINE + ("num_query_groups",) if getattr(m, k) is not None]
    if m.hf_path:
        if inline_set:
            return None, [f"model.{k}: set inline while model.hf_path is given (got {getattr(m, k)}). "
                          f"Remove it; the architecture comes from {m.hf_path}/config.json." for k in inline_set]
        path = os.path.join(m.hf_path, "config.json")
        try:
            with open(path) as f:
                hf = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            return None, [f"model.hf_path: cannot read {path} (got {m.hf_path!r}): {e}. "
                          "Point it at an HF model directory."]
        return {"layers": hf.get("num_hidden_layers"), "heads": hf.get("num_attention_heads"),
                "groups": hf.get("num_key_value_heads") or hf.get("num_attention_heads"),
                "positions": hf.get("max_position_embeddings"), "positions_key": f"{path}: max_position_embeddings"}, []
    missing = [k for k in REQUIRED_INLINE if getattr(m, k) is None]
    if missing:
        return None, [f"model.{k}: required when model.hf_path is empty (got None). Set it, or set "
                      "model.hf_path to an HF model directory." for k in missing]
    from rlhf_mcore.models.registry import MODEL_FAMILIES

    if m.family not in MODEL_FAMILIES:
        return None, [f"model.family: unknown family (got {m.family!r}). Available: {', '.join(MODEL_FAMILIES)}."]
    return {"layers": m.num_layers, "heads": m.num_attention_heads,
            "groups": m.num_query_groups or m.num_attention_heads, "positions": m.max_position_embeddings,
            "positions_key": "model.max_position_embeddings"}, []


def _parallel_rules(cfg: Config, shape: dict, world_size: int | None) -> list[str]:
    p, errs = cfg.parallel, []
    if shape["heads"] % p.tp:
        errs.append(f"parallel.tp: must divide the number of attention heads {shape['heads']} (got {p.tp}). "
                    "Pick a divisor of the head count.")
    if shape["groups"] % p.tp:
        errs.append(f"parallel.tp: must divide the number of KV groups {shape['groups']} (got {p.tp}). "
                    "Pick a divisor of num_key_value_heads.")
    if shape["layers"] % p.pp:
        errs.append(f"parallel.pp: must divide the number of layers {shape['layers']} (got {p.pp}). "
                    "Pick a divisor of the layer count.")
    if cfg.model.make_vocab_size_divisible_by % p.tp:
        errs.append(f"parallel.tp: must divide model.make_vocab_size_divisible_by="
                    f"{cfg.model.make_vocab_size_divisible_by} (got {p.tp}). Use a power of two.")
    if world_size is not None and world_size % (p.tp * p.pp * p.cp):
        errs.append(f"parallel.tp: tp*pp = {p.tp * p.pp} must divide the world size {world_size} "
                    f"(got tp={p.tp}, pp={p.pp}). Launch a multiple of tp*pp ranks.")
    if p.sequence_parallel and p.tp == 1:
        errs.append("parallel.sequence_parallel: needs tp > 1 (got true with tp=1). Set it to false.")
    if cfg.rollout.engine == "sglang" and (p.tp > 1 or p.pp > 1):
        errs.append(f"rollout.engine: sglang runs one engine per GPU and needs parallel.tp=1 and parallel.pp=1 "
                    f"(got tp={p.tp}, pp={p.pp}). Use rollout.engine=native for TP/PP layouts.")
    elif p.sequence_parallel and cfg.rollout.engine == "native":
        errs.append("parallel.sequence_parallel: the native rollout engine cannot decode with it (got true). Set it "
                    "to false; tools/check_layouts.py --sequence-parallel checks training with it.")
    return errs


def _batch_rules(cfg: Config, dp: int) -> list[str]:
    d, n, errs = cfg.data, cfg.rollout.n, []
    if d.train_batch_size % dp:
        errs.append(f"data.train_batch_size: must be divisible by the data-parallel size {dp} "
                    f"(got {d.train_batch_size}). Use a multiple of {dp}.")
    roles = ("actor", "critic") if cfg.algorithm.adv_estimator in VALUE_ESTIMATORS else ("actor",)
    for role in roles:  # the critic's batch sizes matter only when a critic is trained
        section = getattr(cfg, role)
        mini = section.ppo_mini_batch_size
        if d.train_batch_size % mini:
            errs.append(f"{role}.ppo_mini_batch_size: must divide data.train_batch_size={d.train_batch_size} "
                        f"(got {mini}). Use a divisor of the train batch size.")
        per_rank, rem = divmod(mini * n, dp)
        if rem:
            errs.append(f"{role}.ppo_mini_batch_size: times rollout.n={n} must be divisible by the data-parallel "
                        f"size {dp} (got {mini}). Use a multiple of {dp}.")
        elif not (getattr(section, "use_dynamic_bsz", False) or d.use_sequence_packing) and \
                per_rank % section.micro_batch_size_per_gpu:
            errs.append(f"{role}.micro_batch_size_per_gpu: must divide the per-rank mini-batch "
                        f"ppo_mini_batch_size*n/dp={per_rank} (got {section.micro_batch_size_per_gpu}). "
                        "Use a divisor of it.")
    return errs


def _packing_rules(cfg: Config) -> list[str]:
    if cfg.data.use_sequence_packing and cfg.model.attention_backend == "local":
        return ["model.attention_backend: megatron's local attention cannot run packed sequences (got local with "
                "data.use_sequence_packing=true). Use model.attention_backend=sdpa (or auto/te)."]
    return []


def _length_rules(cfg: Config, shape: dict | None) -> list[str]:
    """A prompt plus its response must fit the model's positions and one micro-batch's token budget."""
    seq, errs = cfg.data.max_prompt_length + cfg.rollout.max_response_length, []
    where = "data.max_prompt_length + rollout.max_response_length"
    if shape is not None and shape.get("positions") and shape["positions"] < seq:
        errs.append(f"{shape['positions_key']}: the model has {shape['positions']} positions, fewer than "
                    f"{where} = {seq} (got {shape['positions']}). Shorten the prompt or response lengths.")
    if (cfg.actor.use_dynamic_bsz or cfg.data.use_sequence_packing) and cfg.actor.max_tokens_per_gpu < seq:
        errs.append(f"actor.max_tokens_per_gpu: must hold one sequence of {where} = {seq} tokens "
                    f"(got {cfg.actor.max_tokens_per_gpu}). Set it to at least {seq}.")
    if cfg.reward.overlong_buffer >= cfg.rollout.max_response_length:
        errs.append(f"reward.overlong_buffer: must be below rollout.max_response_length="
                    f"{cfg.rollout.max_response_length} (got {cfg.reward.overlong_buffer}). Use a smaller buffer.")
    return errs


def _algorithm_rules(cfg: Config) -> list[str]:
    from rlhf_mcore.algorithms import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES

    errs = []
    for key, value, registry in (
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, ADVANTAGES),
        ("actor.policy_loss", cfg.actor.policy_loss, POLICY_LOSSES),
        ("actor.kl_loss_type", cfg.actor.kl_loss_type, KL_ESTIMATORS),
        ("algorithm.kl_penalty", cfg.algorithm.kl_penalty, KL_ESTIMATORS),
    ):
        if value not in registry:
            errs.append(f"{key}: unknown name (got {value!r}). Available: {', '.join(registry.names())}.")
    if cfg.algorithm.adv_estimator in GROUP_ESTIMATORS and cfg.rollout.n < 2:
        errs.append(f"rollout.n: {cfg.algorithm.adv_estimator} compares samples of the same prompt and needs "
                    f"at least 2 (got {cfg.rollout.n}). Set rollout.n=4 or more.")
    return errs


def _file_rules(cfg: Config) -> list[str]:
    errs = []
    for key in ("train_files", "val_files"):
        for path in filter(None, getattr(cfg.data, key).split(",")):  # a comma-separated list of files
            if not os.path.exists(path):
                errs.append(f"data.{key}: file not found (got {path!r}). Run tools/prepare_gsm8k.py or fix the path.")
    if not cfg.data.train_files and cfg.trainer.total_steps == 0:
        errs.append("data.train_files: required to run by epochs (got ''). Set it, or set trainer.total_steps.")
    fn = cfg.reward.custom_fn
    if fn and (":" not in fn or not os.path.isfile(fn.rsplit(":", 1)[0])):
        errs.append(f"reward.custom_fn: expected an existing path/to/file.py:function_name (got {fn!r}). "
                    "Fix the path or the ':function_name' part.")
    return errs


def validate(cfg: Config, world_size: int | None = None) -> list[str]:
    """All cross-section errors. world_size=None skips the rules that need it (e.g. --validate-only)."""
    shape, errs = _model_shape(cfg)
    if shape is not None:
        errs += _parallel_rules(cfg, shape, world_size)
    model_parallel = cfg.parallel.tp * cfg.parallel.pp
    dp = world_size // model_parallel if world_size and world_size % model_parallel == 0 else 1
    return errs + _batch_rules(cfg, dp) + _length_rules(cfg, shape) + _packing_rules(cfg) + _algorithm_rules(cfg) + \
        _file_rules(cfg)
