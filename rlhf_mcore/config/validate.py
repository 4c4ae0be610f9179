"""Cross-section rules, checked before any process group or model exists. Each rule is a few lines and
returns error strings of the form "<dotted.key>: <problem> (got <value>). <fix>."."""
from __future__ import annotations

import json
import math
import os
import re

from rlhf_mcore.config.environment import environment_errors
from rlhf_mcore.config.schema import Config, ep_fits
from rlhf_mcore.registry import suggest

REQUIRED_INLINE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_id_error(key: str, path: str) -> str:
    """One line for a Hugging Face Hub id given where a local directory is read ('' when `path` exists or does
    not look like one): the command that downloads it, and what to set. Nothing here downloads.

    >>> print(hub_id_error("model.hf_path", "Qwen/Qwen2.5-0.5B-Instruct"))  # doctest: +NORMALIZE_WHITESPACE
    model.hf_path: 'Qwen/Qwen2.5-0.5B-Instruct' is not a directory here. If it is a Hugging Face Hub id: rlhf-mcore
    reads local directories only (it never downloads); run `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct
    --local-dir models/Qwen2.5-0.5B-Instruct`, then set model.hf_path=models/Qwen2.5-0.5B-Instruct.
    """
    if not path or os.path.exists(path) or not _HUB_ID.fullmatch(path):
        return ""
    local = f"models/{path.split('/')[1]}"
    return (f"{key}: {path!r} is not a directory here. If it is a Hugging Face Hub id: rlhf-mcore reads local "
            f"directories only (it never downloads); run `huggingface-cli download {path} --local-dir {local}`, then "
            f"set {key}={local}.")


def _model_shape(cfg: Config) -> tuple[dict | None, list[str]]:
    """(hf-style dict of the architecture, errors about where it comes from)."""
    m = cfg.model
    inline_set = [k for k in REQUIRED_INLINE + ("num_query_groups",) if getattr(m, k) is not None]
    hub = hub_id_error("model.hf_path", m.hf_path)
    if hub:
        return None, [hub]
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
        from rlhf_mcore.models.registry import spec_for_hf_config
        from rlhf_mcore.models.transformer_config import architecture_errors, sliding_window

        refused = architecture_errors(hf, f"model.hf_path: {path}")  # what the builder would refuse, before it
        if refused:
            return None, refused
        spec = spec_for_hf_config(hf, path)
        hf = spec.text_config(hf)  # a vision-language config.json nests the LM's fields
        window = sliding_window(hf, spec)
        return {"run_errors": spec.run_errors(cfg) + spec.stage_errors(hf, cfg.parallel),
                "layers": hf.get("num_hidden_layers"), "heads": hf.get("num_attention_heads"),
                "groups": hf.get("num_key_value_heads") or hf.get("num_attention_heads"),
                "ffn": hf.get("intermediate_size"), "ffn_key": f"{path}: intermediate_size",
                "positions": hf.get("max_position_embeddings"), "positions_key": f"{path}: max_position_embeddings",
                "window": window, "window_key": path,
                "experts": hf.get("num_experts") or hf.get("num_local_experts") or 0}, []
    missing = [k for k in REQUIRED_INLINE if getattr(m, k) is None]
    if missing:
        return None, [f"model.{k}: required when model.hf_path is empty (got None). Set it, or set "
                      "model.hf_path to an HF model directory." for k in missing]
    from rlhf_mcore.models.registry import MODEL_FAMILIES

    family = MODEL_FAMILIES.get(m.family) if m.family in MODEL_FAMILIES else None  # an unknown one: registry_fields
    return {"run_errors": family.run_errors(cfg) if family else [], "layers": m.num_layers,
            "heads": m.num_attention_heads,
            "groups": m.num_query_groups or m.num_attention_heads, "ffn": m.ffn_hidden_size,
            "ffn_key": "model.ffn_hidden_size", "positions": m.max_position_embeddings,
            "positions_key": "model.max_position_embeddings"}, []


def _parallel_rules(cfg: Config, shape: dict, world_size: int | None) -> list[str]:
    p, errs = cfg.parallel, list(shape.get("run_errors", ()))  # what the model's family cannot run yet
    if shape["heads"] % p.tp:
        errs.append(f"parallel.tp: must divide the number of attention heads {shape['heads']} (got {p.tp}). "
                    "Pick a divisor of the head count.")
    if shape["groups"] % p.tp:
        errs.append(f"parallel.tp: must divide the number of KV groups {shape['groups']} (got {p.tp}). "
                    "Pick a divisor of num_key_value_heads.")
    if shape["ffn"] and shape["ffn"] % p.tp:  # megatron splits the MLP's inner dimension over TP
        errs.append(f"parallel.tp: must divide {shape['ffn_key']}={shape['ffn']} (got {p.tp}). "
                    "Pick a divisor of the MLP size.")
    if shape["layers"] % p.pp:
        errs.append(f"parallel.pp: must divide the number of layers {shape['layers']} (got {p.pp}). "
                    "Pick a divisor of the layer count.")
    if cfg.model.make_vocab_size_divisible_by % p.tp:
        errs.append(f"parallel.tp: must divide model.make_vocab_size_divisible_by="
                    f"{cfg.model.make_vocab_size_divisible_by} (got {p.tp}). Use a power of two.")
    if world_size is not None and world_size % (p.tp * p.pp * p.cp):
        errs.append(f"parallel.tp: tp*pp = {p.tp * p.pp} must divide the world size {world_size} "
                    f"(got tp={p.tp}, pp={p.pp}). Launch a multiple of tp*pp ranks.")
    experts = shape.get("experts", 0)
    if p.ep > 1 and (not experts or experts % p.ep):
        what = f"the expert count {experts}" if experts else "the experts of an MoE model (this model is dense)"
        errs.append(f"parallel.ep: must divide {what} (got {p.ep}). Pick a divisor of num_experts, or ep=1.")
    # the expert group may span TP ranks as well as DP; cp > 1 is refused on its own line (its fix changes dp)
    if world_size is not None and p.cp == 1 and not world_size % (p.tp * p.pp) and \
            not ep_fits(world_size, p.tp, p.pp, p.ep):
        errs.append(f"parallel.ep: must divide tp*dp = world / pp = {world_size // p.pp} "
                    f"(got ep={p.ep}). Launch a multiple of pp*ep ranks, or pick a divisor.")
    if experts and p.tp > 1 and not p.sequence_parallel:  # megatron's MoE layer refuses to train at tp>1 without it
        engine = "" if cfg.rollout.engine == "sglang" else " with rollout.engine=sglang (the native engine decodes " \
                                                           "without it)"
        errs.append(f"parallel.sequence_parallel: an MoE model at tp > 1 needs sequence parallelism (got false with "
                    f"tp={p.tp}; verl's megatron engine turns it on at tp > 1). Set parallel.sequence_parallel=true"
                    f"{engine}, or split the experts with parallel.ep at tp=1.")
    if p.sequence_parallel and p.tp == 1:
        errs.append("parallel.sequence_parallel: needs tp > 1 (got true with tp=1). Set it to false.")
    errs += _router_replay_rules(cfg, experts)
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    if cfg.rollout.engine in ROLLOUT_ENGINES:  # the engine says which layouts it can roll out with
        errs += ROLLOUT_ENGINES.get(cfg.rollout.engine).layout_errors(p)
    return errs


def _router_replay_rules(cfg: Config, experts: int) -> list[str]:
    """actor.router_replay=R2 / R3 needs routers, and at pp > 1 no full recompute: 1F1B recomputes a micro-batch's
    layers after later micro-batches have set their own experts (models.routing). R3 takes the rollout's routing
    from the native engine's eager decode, one generate() per batch (`_r3_rollout_rules`)."""
    mode = cfg.actor.router_replay
    if mode not in ("R2", "R3"):
        return []
    if not experts:
        return [f"actor.router_replay: needs an MoE model (got {mode!r} with a dense model). Set actor.router_replay="
                "disabled."]
    if cfg.parallel.pp > 1 and cfg.model.recompute == "full":
        return [f"actor.router_replay: {mode} cannot replay through full recompute at pp > 1 (got model.recompute="
                f"full with pp={cfg.parallel.pp}). Use model.recompute=selective or none, or parallel.pp=1."]
    return _r3_rollout_rules(cfg) if mode == "R3" else []


def _r3_rollout_rules(cfg: Config) -> list[str]:
    """R3's rollouts: an engine that returns each token's experts (its `records_routing` trait: the native
    engine's eager decode, SGLang's return_routed_experts). Multi-turn rows and partial rollouts are assembled from
    several calls, each continuing a row from its exact prefix: the last call routes the whole row
    (`rollout.modes.trajectory.Trajectory.routing`, `rollout.partial.Sample.routing`)."""
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    errs = []
    engine = cfg.rollout.engine
    if engine in ROLLOUT_ENGINES and not ROLLOUT_ENGINES.traits(engine).records_routing:
        recording = ", ".join(n for n in ROLLOUT_ENGINES.names() if ROLLOUT_ENGINES.traits(n).records_routing)
        errs.append(f"rollout.engine: actor.router_replay=R3 needs the rollout's experts, which only these "
                    f"engines return: {recording} (got {engine!r}). Set rollout.engine to one of them, or "
                    "actor.router_replay=R2.")
    return errs


def _trained_roles(cfg: Config) -> tuple[str, ...]:
    """The actor, and the critic when the estimator declares it needs one (an unknown estimator: the actor)."""
    from rlhf_mcore.algorithms import ADVANTAGES, estimator_needs

    name = cfg.algorithm.adv_estimator
    return ("actor", "critic") if name in ADVANTAGES and estimator_needs(name).critic else ("actor",)


def _batch_rules(cfg: Config, dp: int) -> list[str]:
    d, n, errs = cfg.data, cfg.rollout.n, []
    if d.train_batch_size % dp:
        errs.append(f"data.train_batch_size: must be divisible by the data-parallel size {dp} "
                    f"(got {d.train_batch_size}). Use a multiple of {dp}.")
    for role in _trained_roles(cfg):  # the critic's batch sizes matter only when a critic is trained
        section = getattr(cfg, role)
        mini = section.ppo_mini_batch_size
        if d.train_batch_size % mini:
            errs.append(f"{role}.ppo_mini_batch_size: must divide data.train_batch_size={d.train_batch_size} "
                        f"(got {mini}). Use a divisor of the train batch size.")
        per_rank, rem = divmod(mini * n, dp)
        if rem:
            errs.append(f"{role}.ppo_mini_batch_size: times rollout.n={n} must be divisible by the data-parallel "
                        f"size {dp} (got {mini}). Use a multiple of {dp}.")
        elif not (section.use_dynamic_bsz or d.use_sequence_packing) and \
                per_rank % section.micro_batch_size_per_gpu:
            errs.append(f"{role}.micro_batch_size_per_gpu: must divide the per-rank mini-batch "
                        f"ppo_mini_batch_size*n/dp={per_rank} (got {section.micro_batch_size_per_gpu}). "
                        "Use a divisor of it.")
    return errs


def _backend_rules(cfg: Config, shape: dict | None) -> list[str]:
    if shape is not None and shape.get("window"):  # sliding windows: our SDPA attention only (models.layer_specs)
        from rlhf_mcore.models.layer_specs import backend_errors

        return backend_errors(cfg.model.attention_backend, shape["window"], shape["window_key"])
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
    zero_means = {"max_tokens_per_gpu": "auto", "log_prob_max_tokens_per_gpu": "actor.max_tokens_per_gpu"}
    for key, zero in zero_means.items():
        budget = getattr(cfg.actor, key)
        if (cfg.actor.use_dynamic_bsz or cfg.data.use_sequence_packing) and 0 < budget < seq:
            errs.append(f"actor.{key}: must hold one sequence of {where} = {seq} tokens (got {budget}). "
                        f"Set it to at least {seq} (or 0: {zero}).")
    if cfg.critic.use_dynamic_bsz and "critic" in _trained_roles(cfg) and 0 < cfg.critic.max_tokens_per_gpu < seq:
        errs.append(f"critic.max_tokens_per_gpu: must hold one sequence of {where} = {seq} tokens "
                    f"(got {cfg.critic.max_tokens_per_gpu}). Set it to at least {seq} (or 0: auto).")
    if cfg.reward.overlong_buffer >= cfg.rollout.max_response_length:
        errs.append(f"reward.overlong_buffer: must be below rollout.max_response_length="
                    f"{cfg.rollout.max_response_length} (got {cfg.reward.overlong_buffer}). Use a smaller buffer.")
    return errs


def registry_fields(cfg: Config) -> list[tuple[str, object, tuple[str, ...], str]]:
    """Every config field whose value names a registry entry: (dotted key, registry, values allowed besides
    the registry's choices, noun of the error: "" lists the choices inline, else "unknown <noun>")."""
    from rlhf_mcore.algorithms import (
        ADVANTAGES,
        KL_CONTROLLERS,
        KL_ESTIMATORS,
        LOSS_AGG_MODES,
        MISMATCH_LEVELS,
        MISMATCH_MODES,
        POLICY_LOSSES,
    )
    from rlhf_mcore.models.layer_specs import LAYER_SPECS
    from rlhf_mcore.models.registry import MODEL_FAMILIES
    from rlhf_mcore.rewards.penalties import FORMAT_CHECKS
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES
    from rlhf_mcore.rollout.modes import ROLLOUT_MODES

    family = [] if cfg.model.hf_path else [("model.family", MODEL_FAMILIES, (), "family")]  # else from config.json
    return family + [
        ("model.attention_backend", LAYER_SPECS, ("auto",), ""),
        ("rollout.engine", ROLLOUT_ENGINES, (), ""),
        ("rollout.mode", ROLLOUT_MODES, (), ""),
        ("actor.policy_loss", POLICY_LOSSES, (), "name"),
        ("actor.loss_agg_mode", LOSS_AGG_MODES, (), ""),
        ("critic.loss_agg_mode", LOSS_AGG_MODES, ("",), ""),
        ("actor.kl_loss_type", KL_ESTIMATORS, (), "name"),
        ("actor.rollout_correction", MISMATCH_LEVELS, ("none",), ""),
        ("actor.rollout_correction_mode", MISMATCH_MODES, (), ""),
        ("reward.answer_format", FORMAT_CHECKS, (), ""),
        ("algorithm.adv_estimator", ADVANTAGES, (), "name"),
        ("algorithm.kl_penalty", KL_ESTIMATORS, (), "name"),
        ("algorithm.kl_ctrl_type", KL_CONTROLLERS, (), ""),
    ]


def _registry_rules(cfg: Config) -> list[str]:
    """One loop over `registry_fields`: each value must be one of its registry's choices."""
    errs = []
    for key, registry, extras, noun in registry_fields(cfg):
        section, name = key.split(".")
        value, options = getattr(getattr(cfg, section), name), [*extras, *registry.choices()]
        if value in options:
            continue
        if noun:
            errs.append(f"{key}: unknown {noun} (got {value!r}). Available: {', '.join(sorted(options))}."
                        f"{suggest(value, options)}")
        else:
            errs.append(f"{key}: must be one of {', '.join(options)} (got {value!r}). Pick one of those.")
    return errs


def _algorithm_rules(cfg: Config) -> list[str]:
    from rlhf_mcore.algorithms import ADVANTAGES, estimator_needs

    errs = []
    name = cfg.algorithm.adv_estimator
    if name in ADVANTAGES and estimator_needs(name).groups and cfg.rollout.n < 2:
        errs.append(f"rollout.n: {cfg.algorithm.adv_estimator} compares samples of the same prompt and needs "
                    f"at least 2 (got {cfg.rollout.n}). Set rollout.n=4 or more.")
    if cfg.trainer.critic_warmup > 0 and "critic" not in _trained_roles(cfg):
        errs.append(f"trainer.critic_warmup: trains the critic alone for the first steps, and "
                    f"{cfg.algorithm.adv_estimator} has no critic (got {cfg.trainer.critic_warmup}). Set it to 0, or "
                    "use algorithm.adv_estimator=gae.")
    return errs + _filter_groups_rules(cfg) + _old_log_prob_rules(cfg)


def _old_log_prob_rules(cfg: Config) -> list[str]:
    """actor.old_log_prob=rollout skips the old-policy pass: nothing may need what only that pass computes."""
    from rlhf_mcore.algorithms import ADVANTAGES, estimator_needs

    a = cfg.actor
    if a.old_log_prob != "rollout":
        return []
    why = "the old-policy pass computes it; set actor.old_log_prob=recompute"
    errs = []
    if cfg.algorithm.adv_estimator in ADVANTAGES and estimator_needs(cfg.algorithm.adv_estimator).sum_pi_squared:
        errs.append(f"algorithm.adv_estimator: {cfg.algorithm.adv_estimator} needs the old policy's sum pi^2 "
                    f"(got actor.old_log_prob=rollout): {why}.")
    if a.router_replay == "R2":
        errs.append(f"actor.router_replay: R2 replays the experts the old-policy pass records (got 'R2' with "
                    f"actor.old_log_prob=rollout): {why}.")
    if a.rollout_correction != "none" and a.policy_loss != "bypass_mode":
        errs.append(f"actor.rollout_correction: with actor.old_log_prob=rollout pi_old is the rollout's, so there "
                    f"is nothing to correct (got {a.rollout_correction!r}). Set actor.rollout_correction=none, or "
                    "actor.old_log_prob=recompute to weight by pi_old / pi_rollout.")
    return errs


def _filter_groups_rules(cfg: Config) -> list[str]:
    """Dynamic sampling compares the n samples of a prompt: a group estimator with rollout.n >= 2."""
    from rlhf_mcore.algorithms import ADVANTAGES, estimator_needs

    a, key = cfg.algorithm, "algorithm.filter_groups"
    if not a.filter_groups.enable:
        return []
    errs = []
    if a.adv_estimator in ADVANTAGES and not estimator_needs(a.adv_estimator).groups:
        groups = ", ".join(n for n in ADVANTAGES.choices() if estimator_needs(n).groups)
        errs.append(f"{key}.enable: needs a group estimator, whose baseline comes from the prompt's samples "
                    f"(got algorithm.adv_estimator={a.adv_estimator}). Use one of {groups}, or set it to false.")
    if cfg.rollout.n < 2:
        errs.append(f"{key}.enable: needs rollout.n >= 2 samples per prompt to compare (got {cfg.rollout.n}). "
                    "Set rollout.n=4 or more, or set it to false.")
    if a.filter_groups.metric == "seq_final_reward" and a.use_kl_in_reward:
        errs.append(f"{key}.metric: the KL penalty enters the reward after the groups are chosen, so "
                    "seq_final_reward would ignore it (got seq_final_reward with algorithm.use_kl_in_reward=true). "
                    "Use seq_reward.")
    return errs


def _multi_turn_rules(cfg: Config) -> list[str]:
    """rollout.mode=multi_turn: its tools load (built-ins by name, tools_file's checked) and its parser
    exists, before any model is built."""
    if cfg.rollout.mode != "multi_turn":
        return []
    from rlhf_mcore.agent.parsers import TOOL_CALL_PARSERS
    from rlhf_mcore.agent.tools import load_tools

    m, key, errs = cfg.rollout.multi_turn, "rollout.multi_turn", []
    if m.parser not in TOOL_CALL_PARSERS.choices():
        errs.append(f"{key}.parser: must be one of {', '.join(TOOL_CALL_PARSERS.choices())} (got {m.parser!r}). "
                    "Pick one of those.")
    if not m.tools and not m.tools_file:
        errs.append(f"{key}.tools: multi_turn needs at least one tool (got []). Set {key}.tools=[python] (or "
                    f"calculator), or {key}.tools_file.")
        return errs
    try:
        load_tools(list(m.tools), m.tools_file or None)
    except ValueError as e:
        errs.append(f"{key}.tools: {e}" if not str(e).startswith(key) else str(e))
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


def _lora_adapter_rules(cfg: Config) -> list[str]:
    """model.lora_adapter_path: a PEFT LoRA adapter whose r, alpha and target modules are the config's."""
    m = cfg.model
    if not m.lora_adapter_path:
        return []
    if not m.lora_rank:
        return [f"model.lora_adapter_path: starts LoRA adapters, but LoRA is off (got model.lora_rank=0 with "
                f"{m.lora_adapter_path!r}). Set model.lora_rank to the adapter's r."]
    from rlhf_mcore.models.lora import expand_targets
    from rlhf_mcore.models.lora_export import adapter_dir_errors

    try:
        targets = expand_targets(m.target_modules)
    except ValueError:
        return []  # model.target_modules reports it
    return adapter_dir_errors(m.lora_adapter_path, m.lora_rank, m.lora_alpha, targets)


def _async_rules(cfg: Config) -> list[str]:
    """async_training: carrying samples needs a staleness bound of at least one version."""
    a, p = cfg.async_training, "async_training"
    if not a.partial_rollout:
        return [] if a.staleness_threshold == 0 else [
            f"{p}.staleness_threshold: bounds the lag of carried samples, but {p}.partial_rollout is off (got "
            f"{a.staleness_threshold}). Set {p}.partial_rollout=true, or leave the threshold at 0."]
    errs = []
    if math.ceil(a.staleness_threshold) < 1:
        errs.append(f"{p}.partial_rollout: needs {p}.staleness_threshold >= 1 (got {a.staleness_threshold}): a "
                    "carried sample is one version old when it trains. Set it to 1 (verl's fractions round up).")
    if a.round_tokens and cfg.rollout.max_response_length % a.round_tokens:
        errs.append(f"{p}.round_tokens: must divide rollout.max_response_length={cfg.rollout.max_response_length} "
                    f"(got {a.round_tokens}). Pick a divisor, or 0 for a quarter of it.")
    return errs


def validate(cfg: Config, world_size: int | None = None) -> list[str]:
    """All cross-section errors. world_size=None skips the rules that need it (e.g. --validate-only). Sizes
    past their bounds come alone: the other rules would compute with them."""
    from rlhf_mcore.config.bounds import bound_errors

    too_large = bound_errors(cfg)
    if too_large:
        return too_large
    shape, errs = _model_shape(cfg)
    if shape is not None:
        errs += _parallel_rules(cfg, shape, world_size)
    model_parallel = cfg.parallel.tp * cfg.parallel.pp
    dp = world_size // model_parallel if world_size and world_size % model_parallel == 0 else 1
    errs += _registry_rules(cfg) + environment_errors(cfg)
    return errs + _batch_rules(cfg, dp) + _length_rules(cfg, shape) + _backend_rules(cfg, shape) + \
        _algorithm_rules(cfg) + _file_rules(cfg) + _lora_adapter_rules(cfg) + _multi_turn_rules(cfg) + \
        _async_rules(cfg) + [
            e for e in (hub_id_error("model.tokenizer", cfg.model.tokenizer),
                        hub_id_error("reward.model_path", cfg.reward.model_path)) if e]
