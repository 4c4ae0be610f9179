"""verl's dotted config keys, accepted as aliases of ours: a verl command line or overrides YAML runs as is.

One table, three kinds of entry (`VERL_KEYS`; `verl_entry` defines them, `verl_noops` holds most ignored ones):
  alias     the verl key sets one or more of our keys, the value converted where the meaning differs
            (`enable_gradient_checkpointing=True` -> `model.recompute=full`);
  ignored   the key has no effect here (FSDP offload, vLLM's own TP); accepted with a note that says why;
  rejected  we cannot honour it; one error that says what to use instead.
Each translated key gives one info line naming ours. A key under verl's `actor_rollout_ref.` that the
table lacks is an error with a did-you-mean over the table. Our own keys always win: a key that exists in
our schema is never translated (`data.train_files`, `trainer.save_freq`, ... mean the same in both).
docs/verl.md's table is `markdown_table()` (a test keeps the two equal).
"""
from __future__ import annotations

from typing import Any

from rlhf_mcore.config.verl_entry import VerlKey, alias, ignored, rejected
from rlhf_mcore.config.verl_noops import LOGPROB_MB, NOOP_KEYS, ROLLOUT_TP
from rlhf_mcore.registry import suggest

_ARR = "actor_rollout_ref"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _recompute(value: Any) -> str:
    return "full" if _truthy(value) else "none"


def _engine(value: Any) -> str:
    """verl's rollout.name -> rollout.engine: sglang (and its sglang_async) is sglang; vllm/hf decode with our native
    engine."""
    return "sglang" if str(value).strip().lower().startswith("sglang") else "native"


def _mode(value: Any) -> str:
    """verl's rollout.multi_turn.enable -> rollout.mode."""
    return "multi_turn" if _truthy(value) else "single_turn"


def _rollout_routing(value: Any) -> str | None:
    """verl's rollout.enable_rollout_routing_replay: True is R3 (the rollout records, every pass replays); False
    sets nothing (None), so router_replay.mode decides."""
    return "R3" if _truthy(value) else None


def _verl_tools(value: Any) -> list[str]:
    """verl's rollout.multi_turn.tool_config_path (a YAML of tool classes) -> our built-in tools' names."""
    from rlhf_mcore.agent.grading_tools import verl_tool_names

    return verl_tool_names(str(value).strip())


def _path_or_none(value: Any) -> str:
    """A verl path that may be null (verl's default): our empty string."""
    return "" if value is None or str(value).strip() in ("", "null", "None", "~") else str(value).strip()


def _dtype(value: Any) -> str:
    """verl's megatron dtype (bfloat16 | float16 | float32) -> model.dtype."""
    return {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}.get(str(value).strip(), str(value))


def _recompute_granularity(value: Any) -> str:
    """verl's override_transformer_config.recompute_granularity (full | selective | null) -> model.recompute."""
    return {"full": "full", "selective": "selective"}.get(str(value).strip().lower(), "none")


# The layout keys of verl's megatron engine config (`engine/megatron.yaml`), which each of verl's roles has: ours
# run every role on one TP/PP/EP layout (one process group), so a reference's or critic's value must be the actor's
# (`layout_conflicts` says so when it is not).
LAYOUT = {"tensor_model_parallel_size": "parallel.tp", "pipeline_model_parallel_size": "parallel.pp",
          "expert_model_parallel_size": "parallel.ep", "expert_tensor_parallel_size": "parallel.etp",
          "context_parallel_size": "parallel.cp", "sequence_parallel": "parallel.sequence_parallel"}
_OFFLOAD = ("trainer.offload_during_rollout=true moves the trained roles' optimizer states to host memory and frees "
            "their gradient buffers while the rollout runs; weights stay (the native engine decodes with them); "
            "there is no per-role offload")


def megatron_keys(prefix: str, role: str, load_key: str) -> dict[str, VerlKey]:
    """verl's `<role>.megatron.*` keys (its megatron engine config) for one role."""
    shared = "" if role == "actor" else f"the {role} shares the actor's layout (one process group for every role)"
    keys = {f"{prefix}.{name}": alias(ours, note=shared) for name, ours in LAYOUT.items()}
    keys.update({
        f"{prefix}.virtual_pipeline_model_parallel_size": ignored(
            "virtual pipeline stages are not used: each PP rank holds one chunk", only="None"),
        f"{prefix}.use_distributed_optimizer": alias("parallel.use_distributed_optimizer") if role == "actor" else
        ignored(f"the {role}'s optimizer follows parallel.use_distributed_optimizer (the actor's)"),
        f"{prefix}.param_offload": ignored(_OFFLOAD),
        f"{prefix}.grad_offload": ignored(_OFFLOAD),
        f"{prefix}.optimizer_offload": ignored(_OFFLOAD),
        f"{prefix}.use_dist_checkpointing": ignored(f"a megatron checkpoint is loaded when {load_key} names one "
                                                    f"({prefix}.dist_checkpointing_path sets it)"),
        f"{prefix}.dist_checkpointing_path": alias(load_key),
        f"{prefix}.dist_checkpointing_prefix": ignored("our checkpoints' keys carry no prefix", only=""),
        f"{prefix}.seed": ignored("weights come from the checkpoint; trainer.seed seeds everything random"),
        f"{prefix}.use_mbridge": ignored("HF weights load directly from model.hf_path (no mbridge needed)"),
        f"{prefix}.vanilla_mbridge": ignored("HF weights load directly from model.hf_path (no mbridge needed)"),
        f"{prefix}.forward_only": ignored("whether a role trains follows from the algorithm"),
        f"{prefix}.dtype": alias("model.dtype", convert=_dtype) if role == "actor" else
        ignored(f"the {role} computes in model.dtype (the actor's)"),
        f"{prefix}.override_ddp_config.": ignored("DDP is configured by parallel.* (bucketing, overlap as megatron's "
                                                  "defaults)"),
        f"{prefix}.override_mcore_model_config.": ignored("the model's config comes from model.hf_path"),
        f"{prefix}.override_transformer_config.": ignored(
            "megatron's TransformerConfig is built from model.* (recompute, attention backend) and the HF config"),
        f"{prefix}.override_transformer_config.recompute_granularity":
            alias("model.recompute", convert=_recompute_granularity) if role == "actor" else
            ignored(f"the {role} recomputes as model.recompute says (the actor's)"),
        f"{prefix}.use_remove_padding": alias("data.use_sequence_packing") if role == "actor" else
        ignored(f"the {role}'s forwards pack as data.use_sequence_packing says (the actor's)"),
        **{f"{prefix}.{block}": ignored("an empty override block changes nothing here", only="{}")
           for block in ("override_ddp_config", "override_mcore_model_config", "override_transformer_config")},
        f"{prefix}.override_transformer_config.attention_backend": ignored(
            "model.attention_backend picks it (auto: TE where importable, else SDPA, which runs flash on a GPU)"),
    })
    return keys


def layout_conflicts(items) -> list[str]:
    """One error per layout key of ours that verl keys of different roles set to different values.

    >>> layout_conflicts([("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "2"),
    ...                   ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size", "4")])[0][:71]
    'actor_rollout_ref.ref.megatron.tensor_model_parallel_size: 4, but actor'
    """
    first: dict[str, tuple[str, str]] = {}
    errors = []
    for dotted, value in items:
        name = dotted.rsplit(".", 1)[-1]
        if ".megatron." not in dotted or name not in LAYOUT:
            continue
        ours = LAYOUT[name]
        if ours not in first:
            first[ours] = (dotted, str(value).strip())
        elif first[ours][1] != str(value).strip():
            other, seen = first[ours]
            errors.append(f"{dotted}: {value}, but {other}={seen}: every role runs on one layout here (one process "
                          f"group; verl can give each role its own). Set both to one value ({ours}).")
    return errors


def _resume_mode(value: Any) -> str:
    value = str(value).strip()
    return value if value in ("auto", "disable") else "auto"  # resume_path: the path key sets trainer.resume


_FSDP = ("FSDP options have no effect: megatron shards the model with parallel.tp/pp and "
         "parallel.use_distributed_optimizer")
_LOGPROB_TOK = "one budget for the old-policy and reference passes: the last one given wins"
_FORWARD_TOK = "one budget for every forward-only pass (log-probs, values, reward model): the last one given wins"
_WORLD = "the world size comes from torchrun (--nproc_per_node x nodes); parallel.tp/pp split it"

def _minutes(value: Any) -> float:
    """verl's nccl_timeout (seconds) -> parallel.collective_timeout_min.

    >>> _minutes("1200")
    20.0
    """
    return float(value) / 60.0


def _correction_level(value: Any) -> str:
    """verl's algorithm.rollout_correction.rollout_is (null | token | sequence) -> actor.rollout_correction."""
    value = str(value).strip()
    return "none" if value in ("None", "null", "~", "") else value

VERL_KEYS: dict[str, VerlKey] = {
    # model
    f"{_ARR}.model.path": alias("model.hf_path"),
    f"{_ARR}.model.use_remove_padding": alias("data.use_sequence_packing"),
    f"{_ARR}.model.enable_gradient_checkpointing": alias("model.recompute", convert=_recompute),
    f"{_ARR}.model.use_fused_kernels": ignored("the fused log-prob kernel is chosen by device (diagnose shows it)"),
    f"{_ARR}.model.trust_remote_code": ignored("models are built from config.json by our model registry"),
    f"{_ARR}.model.lora_rank": alias("model.lora_rank"),
    f"{_ARR}.model.lora_alpha": alias("model.lora_alpha"),
    f"{_ARR}.model.target_modules": alias("model.target_modules"),
    f"{_ARR}.model.freeze_vision_tower": alias("model.freeze_vision_tower"),
    f"{_ARR}.model.exclude_modules": rejected("list the projections to adapt in model.target_modules"),
    # verl's megatron LoRA (Megatron-Bridge's): megatron's linear names are model.target_modules names too
    f"{_ARR}.model.lora.rank": alias("model.lora_rank"),
    f"{_ARR}.model.lora.alpha": alias("model.lora_alpha"),
    f"{_ARR}.model.lora.dropout": alias("model.lora_dropout"),
    f"{_ARR}.model.lora.target_modules": alias("model.target_modules"),
    f"{_ARR}.model.lora.adapter_path": alias("model.lora_adapter_path", convert=_path_or_none),
    f"{_ARR}.model.lora.type": ignored("plain LoRA on the fused linears is ours (canonical_lora / dora / vlm_lora "
                                       "are not)", only="lora"),
    f"{_ARR}.model.lora.merge": ignored("SGLang always receives merged weights (W + scale B A) at each sync"),
    f"{_ARR}.model.lora.dropout_position": ignored("dropout hits the LoRA input", only="pre"),
    f"{_ARR}.model.lora.lora_A_init_method": ignored("A is kaiming-uniform as PEFT's, seeded per layer"),
    f"{_ARR}.model.lora.lora_B_init_method": ignored("B starts at zero", only="zero"),
    f"{_ARR}.model.lora.dtype": ignored("adapters take the model's dtype (model.dtype)"),
    f"{_ARR}.model.lora.a2a_experimental": ignored("experts' adapters run with the experts (EP)", only="False"),
    f"{_ARR}.model.lora.exclude_modules": ignored("list the projections to adapt in model.target_modules",
                                                  only="[]"),
    f"{_ARR}.model.lora.freeze_vision_model": ignored("LoRA adapts the language model; the tower follows "
                                                      "model.freeze_vision_tower"),
    f"{_ARR}.model.lora.freeze_vision_projection": ignored("the merger follows model.freeze_vision_tower"),
    f"{_ARR}.model.lora.freeze_language_model": ignored("the language model's base is frozen under LoRA",
                                                        only="True"),
    # actor
    f"{_ARR}.actor.optim.lr": alias("actor.optim.lr"),
    f"{_ARR}.actor.optim.weight_decay": alias("actor.optim.weight_decay"),
    f"{_ARR}.actor.optim.lr_warmup_steps": alias("actor.optim.lr_warmup_steps"),
    f"{_ARR}.actor.optim.min_lr_ratio": alias("actor.optim.min_lr_ratio"),
    f"{_ARR}.actor.optim.lr_warmup_steps_ratio": rejected("set actor.optim.lr_warmup_steps (a step count)"),
    f"{_ARR}.actor.optim.override_optimizer_config.": ignored(
        "megatron's optimizer is built from actor.optim.* and parallel.use_distributed_optimizer; its CPU offload "
        "is not supported: " + _OFFLOAD),
    f"{_ARR}.actor.grad_clip": alias("actor.optim.grad_clip"),
    f"{_ARR}.actor.optim.clip_grad": alias("actor.optim.grad_clip"),  # verl's newer name
    f"{_ARR}.actor.ppo_mini_batch_size": alias("actor.ppo_mini_batch_size"),
    f"{_ARR}.actor.ppo_micro_batch_size_per_gpu": alias("actor.micro_batch_size_per_gpu"),
    f"{_ARR}.actor.ppo_micro_batch_size": rejected(
        f"set {_ARR}.actor.ppo_micro_batch_size_per_gpu (verl deprecated the global micro-batch size)"),
    f"{_ARR}.actor.ppo_epochs": alias("actor.ppo_epochs"),
    f"{_ARR}.actor.use_dynamic_bsz": alias("actor.use_dynamic_bsz"),
    f"{_ARR}.actor.ppo_max_token_len_per_gpu": alias("actor.max_tokens_per_gpu"),
    f"{_ARR}.actor.clip_ratio": alias("actor.clip_ratio_low", "actor.clip_ratio_high"),
    f"{_ARR}.actor.clip_ratio_low": alias("actor.clip_ratio_low"),
    f"{_ARR}.actor.clip_ratio_high": alias("actor.clip_ratio_high"),
    f"{_ARR}.actor.clip_ratio_c": alias("actor.clip_ratio_c"),
    f"{_ARR}.actor.loss_agg_mode": alias("actor.loss_agg_mode"),
    f"{_ARR}.actor.entropy_coeff": alias("actor.entropy_coeff"),
    f"{_ARR}.actor.use_kl_loss": alias("actor.use_kl_loss"),
    f"{_ARR}.actor.kl_loss_coef": alias("actor.kl_loss_coef"),
    f"{_ARR}.actor.kl_loss_type": alias("actor.kl_loss_type"),
    f"{_ARR}.actor.policy_loss.loss_mode": alias("actor.policy_loss"),
    f"{_ARR}.actor.policy_loss.ppo_kl_coef": alias("actor.kl_cov_coef"),
    f"{_ARR}.actor.policy_loss.kl_cov_ratio": alias("actor.kl_cov_ratio"),
    f"{_ARR}.actor.tau_pos": alias("actor.tau_pos"),
    f"{_ARR}.actor.tau_neg": alias("actor.tau_neg"),
    **megatron_keys(f"{_ARR}.actor.megatron", "actor", "model.load"),
    **megatron_keys(f"{_ARR}.ref.megatron", "reference", "ref.load"),
    **megatron_keys("critic.megatron", "critic", "critic.load"),
    f"{_ARR}.actor.router_replay.mode": alias("actor.router_replay"),
    f"{_ARR}.actor.megatron.router_replay.mode": alias("actor.router_replay"),
    f"{_ARR}.actor.fsdp_config.": ignored(_FSDP),
    f"{_ARR}.actor.strategy": ignored("the strategy is megatron-core, always"),
    f"{_ARR}.nccl_timeout": alias("parallel.collective_timeout_min", convert=_minutes,
                                  note="seconds in verl, minutes here"),
    # rollout
    f"{_ARR}.rollout.name": alias("rollout.engine", convert=_engine,
                                  note="vllm is not embedded: vllm/hf decode with the native engine"),
    f"{_ARR}.rollout.n": alias("rollout.n"),
    f"{_ARR}.rollout.temperature": alias("rollout.temperature"),
    f"{_ARR}.rollout.top_p": alias("rollout.top_p"),
    f"{_ARR}.rollout.top_k": alias("rollout.top_k"),
    f"{_ARR}.rollout.response_length": alias("rollout.max_response_length"),
    f"{_ARR}.rollout.gpu_memory_utilization": alias("rollout.sglang.gpu_memory_utilization"),
    f"{_ARR}.rollout.val_kwargs.temperature": alias("rollout.val_temperature"),
    f"{_ARR}.rollout.val_kwargs.n": alias("rollout.val_n"),
    f"{_ARR}.rollout.val_kwargs.top_p": alias("rollout.val_top_p"),
    f"{_ARR}.rollout.val_kwargs.top_k": alias("rollout.val_top_k"),
    f"{_ARR}.rollout.val_kwargs.do_sample": alias("rollout.val_do_sample"),
    f"{_ARR}.rollout.tensor_model_parallel_size": ignored(ROLLOUT_TP),
    f"{_ARR}.rollout.log_prob_micro_batch_size_per_gpu": ignored(LOGPROB_MB),
    f"{_ARR}.rollout.log_prob_micro_batch_size": ignored(LOGPROB_MB),
    f"{_ARR}.rollout.log_prob_use_dynamic_bsz": ignored(LOGPROB_MB),
    f"{_ARR}.rollout.engine_kwargs.": ignored("vLLM / SGLang server arguments: the embedded SGLang engine takes "
                                              "rollout.sglang.*, the native engine none"),
    f"{_ARR}.rollout.log_prob_max_token_len_per_gpu": alias("actor.log_prob_max_tokens_per_gpu", note=_LOGPROB_TOK),
    f"{_ARR}.hybrid_engine": ignored("actor, reference and rollout always share the ranks here (one SPMD program)",
                                     only="True"),
    f"{_ARR}.rollout.max_num_seqs": alias("async_training.max_num_seqs", note=(
        "samples decoded at once by partial rollouts' continuous batching; a synchronous step decodes its rows "
        "together (rollout.micro_batch_size bounds them)")),
    f"{_ARR}.rollout.mode": ignored("rollout is always in-process and synchronous"),
    f"{_ARR}.rollout.enable_rollout_routing_replay": alias("actor.router_replay", convert=_rollout_routing, note=(
        "the native rollout records each token's experts; False leaves actor.router_replay as it is")),
    f"{_ARR}.rollout.multi_turn.enable": alias("rollout.mode", convert=_mode),
    f"{_ARR}.rollout.multi_turn.max_assistant_turns": alias("rollout.multi_turn.max_turns"),
    f"{_ARR}.rollout.multi_turn.max_parallel_calls": alias("rollout.multi_turn.max_tool_calls"),
    f"{_ARR}.rollout.multi_turn.max_tool_response_length": alias("rollout.multi_turn.max_tool_response_chars"),
    f"{_ARR}.rollout.multi_turn.format": alias("rollout.multi_turn.parser"),
    f"{_ARR}.rollout.multi_turn.max_user_turns": ignored("tool turns follow assistant turns: max_turns bounds both"),
    f"{_ARR}.rollout.multi_turn.tool_config_path": alias("rollout.multi_turn.tools", convert=_verl_tools, note=(
        "verl's Gsm8kTool and Geo3kTool are built-ins; write other tools in rollout.multi_turn.tools_file")),
    f"{_ARR}.rollout.multi_turn.interaction_config_path": rejected(
        "simulated users (interactions) are not supported; rows keep extra_info.interaction_kwargs for rewards"),
    # reference
    f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu": ignored(LOGPROB_MB),
    f"{_ARR}.ref.log_prob_micro_batch_size": ignored(LOGPROB_MB),
    f"{_ARR}.ref.log_prob_max_token_len_per_gpu": alias("actor.log_prob_max_tokens_per_gpu", note=_LOGPROB_TOK),
    f"{_ARR}.ref.log_prob_use_dynamic_bsz": ignored(LOGPROB_MB),
    f"{_ARR}.ref.fsdp_config.": ignored(_FSDP),
    # data
    "data.max_response_length": alias("rollout.max_response_length"),
    "data.truncation": ignored("prompts longer than data.max_prompt_length are filtered "
                               "(data.filter_overlong_prompts) or rejected, never cut"),
    "data.image_key": ignored("images are read from verl's 'images' column; rename another column to it",
                              only="images"),
    "data.prompt_key": ignored("prompts are read from verl's 'prompt' column; rename another column to it",
                               only="prompt"),
    "data.return_raw_chat": ignored("prompts are chat-templated by the tokenizer"),
    "data.gen_batch_size": rejected("each generation round of algorithm.filter_groups draws data.train_batch_size "
                                    "prompts; remove it (scale max_num_gen_batches by gen/train for verl's budget)"),
    # critic
    "critic.model.path": ignored("the critic starts from the actor's weights (or critic.load)"),
    "critic.model.": ignored(_FSDP),
    "critic.model.lora_rank": alias("critic.lora_rank"),
    "critic.model.lora.rank": alias("critic.lora_rank"),
    "critic.model.lora.": ignored("the critic's LoRA uses the actor's settings but its rank (critic.lora_rank)"),
    "critic.model.lora_alpha": ignored("the critic's LoRA uses model.lora_alpha (the actor's)"),
    "critic.model.target_modules": ignored("the critic's LoRA uses model.target_modules (the actor's)"),
    "critic.ppo_micro_batch_size_per_gpu": alias("critic.micro_batch_size_per_gpu"),
    "critic.ppo_max_token_len_per_gpu": alias("critic.max_tokens_per_gpu"),
    "critic.grad_clip": alias("critic.optim.grad_clip"),
    "critic.optim.clip_grad": alias("critic.optim.grad_clip"),
    "critic.forward_max_token_len_per_gpu": alias("actor.log_prob_max_tokens_per_gpu", note=_FORWARD_TOK),
    "reward_model.forward_max_token_len_per_gpu": alias("actor.log_prob_max_tokens_per_gpu", note=_FORWARD_TOK),
    "critic.optim.lr_warmup_steps_ratio": rejected("set critic.optim.lr_warmup_steps (a step count)"),
    "critic.strategy": ignored("the strategy is megatron-core, always"),
    # algorithm
    "algorithm.kl_ctrl.kl_coef": alias("algorithm.kl_coef"),
    "algorithm.kl_ctrl.type": alias("algorithm.kl_ctrl_type"),
    "algorithm.kl_ctrl.target_kl": alias("algorithm.target_kl"),
    "algorithm.kl_ctrl.horizon": alias("algorithm.kl_horizon"),
    "algorithm.norm_adv_by_std_in_grpo": alias("algorithm.norm_adv_by_std"),
    # verl's rollout correction (TIS): truncated importance weights pi_old / pi_rollout (algorithms/mismatch.py)
    "algorithm.rollout_correction.rollout_is": alias("actor.rollout_correction", convert=_correction_level),
    "algorithm.rollout_correction.rollout_is_threshold": alias("actor.rollout_correction_threshold"),
    "algorithm.rollout_correction.rollout_is_batch_normalize": ignored("the weights are not renormalised",
                                                                       only="False"),
    "algorithm.rollout_correction.rollout_rs": ignored(
        "verl's rejection modes are not ours: actor.rollout_correction_mode=mask zeroes the weights outside the "
        "threshold (MIS)", only="None"),
    "algorithm.rollout_correction.bypass_mode": ignored(
        "set actor.policy_loss=bypass_mode (the rollout's log-probs as pi_old)", only="False"),
    # reward
    "reward_model.enable": ignored("a reward model runs when reward.model_path is set"),
    "reward_model.num_workers": alias("reward.num_workers"),
    "reward.custom_reward_function.path": alias("reward.custom_fn", note="verl 0.9's place of custom_reward_function"),
    "reward.custom_reward_function.name": alias("reward.custom_fn", note="verl 0.9's place of custom_reward_function"),
    "reward_model.model.path": alias("reward.model_path"),
    "custom_reward_function.path": alias("reward.custom_fn", note="with custom_reward_function.name, or verl's "
                                         "default name compute_score"),
    "custom_reward_function.name": alias("reward.custom_fn", note="the function of custom_reward_function.path"),
    "reward_model.reward_manager": ignored("rewards run per sample in reward workers; DAPO's overlong penalty is "
                                           "reward.overlong_buffer (reward_model.overlong_buffer.*)"),
    "reward_model.overlong_buffer.enable": ignored("reward_model.overlong_buffer.len sets reward.overlong_buffer; "
                                                   "0 turns it off", only="True"),
    "reward_model.overlong_buffer.len": alias("reward.overlong_buffer"),
    "reward_model.overlong_buffer.penalty_factor": alias("reward.overlong_penalty_factor"),
    "reward_model.overlong_buffer.log": ignored("the overlong penalty shows in the reward metrics"),
    # the DAPO reward manager's kwargs, as verl's recipe scripts pass them (+reward_model.reward_kwargs.*)
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": ignored(
        "reward_model.reward_kwargs.overlong_buffer_cfg.len sets reward.overlong_buffer; 0 turns it off", only="True"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": alias("reward.overlong_buffer"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": alias("reward.overlong_penalty_factor"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": ignored("the overlong penalty shows in the reward metrics"),
    "reward_model.reward_kwargs.max_resp_len": ignored(
        "the overlong buffer ends at rollout.max_response_length (data.max_response_length)"),
    # trainer
    "trainer.n_gpus_per_node": ignored(_WORLD),
    "trainer.nnodes": ignored(_WORLD),
    "trainer.total_training_steps": alias("trainer.total_steps"),
    "trainer.default_local_dir": alias("trainer.output_dir"),
    "trainer.resume_mode": alias("trainer.resume", convert=_resume_mode),
    "trainer.resume_from_path": alias("trainer.resume"),
    "trainer.max_actor_ckpt_to_keep": alias("trainer.max_checkpoints_to_keep"),
    "trainer.balance_batch": ignored("with data.use_sequence_packing, rows are balanced across DP ranks by tokens"),
    # the fully-async recipe's keys (ours: async_training.partial_rollout, .staleness_threshold, .round_tokens)
    "async_training.trigger_parameter_sync_step": ignored(
        "the rollout runs on the training ranks: the weights it uses refresh after every step"),
    "async_training.require_batches": ignored("a step trains one batch (data.train_batch_size) of complete groups"),
    "async_training.compute_prox_log_prob": ignored(
        "the old log-probs are recomputed at the current weights whenever a token is stale (decoupled PPO)"),
    "async_training.use_rollout_log_probs": alias(
        "actor.old_log_prob", convert=lambda v: "rollout" if _truthy(v) else "recompute"),
    **NOOP_KEYS,
}


def lookup(dotted: str) -> VerlKey | None:
    """The table entry for a verl key: an exact key, or the longest prefix entry (keys ending in '.')."""
    if dotted in VERL_KEYS:
        return VERL_KEYS[dotted]
    prefixes = [k for k in VERL_KEYS if k.endswith(".") and dotted.startswith(k)]
    return VERL_KEYS[max(prefixes, key=len)] if prefixes else None


def is_verl_key(dotted: str, our_keys) -> bool:
    """Translate this key? Never one of ours; always one under actor_rollout_ref."""
    return dotted not in our_keys and (dotted.startswith(f"{_ARR}.") or lookup(dotted) is not None)


CUSTOM_REWARD = {"custom_reward_function.path": 0, "custom_reward_function.name": 1,  # part of path:name
                 "reward.custom_reward_function.path": 0, "reward.custom_reward_function.name": 1}  # verl 0.9's


def custom_reward_fn(current: str, dotted: str, value: Any) -> str:
    """reward.custom_fn after verl's custom_reward_function.path or .name `value` (the other part kept; verl's
    default function name is compute_score).

    >>> custom_reward_fn("", "custom_reward_function.path", "r.py")
    'r.py:compute_score'
    >>> custom_reward_fn("r.py:compute_score", "custom_reward_function.name", "my_score")
    'r.py:my_score'
    """
    current = str(current)
    parts = current.rsplit(":", 1) if ":" in current else [current, ""]
    parts[CUSTOM_REWARD[dotted]] = str(value)
    return f"{parts[0]}:{parts[1] or 'compute_score'}"


def translate(dotted: str, value: Any) -> tuple[list[tuple[str, Any]], str | None, str | None]:
    """(our (key, value) pairs, an info note or None, an error or None) for one verl key.

    >>> translate("actor_rollout_ref.actor.optim.lr", "1e-6")
    ([('actor.optim.lr', '1e-6')], 'verl key actor_rollout_ref.actor.optim.lr -> actor.optim.lr', None)
    >>> translate("actor_rollout_ref.model.enable_gradient_checkpointing", "True")[0]
    [('model.recompute', 'full')]
    >>> translate("trainer.nnodes", "1")[1]
    'verl key trainer.nnodes ignored: the world size comes from torchrun (--nproc_per_node x nodes); \
parallel.tp/pp split it'
    """
    entry = lookup(dotted)
    if entry is None:
        known = [k for k in VERL_KEYS if not k.endswith(".")]
        return [], None, (f"{dotted}: unknown verl key (got {value!r}).{suggest(dotted, known)} "
                          "See docs/verl.md for the keys we translate.")
    if entry.rejected:
        return [], None, f"{dotted}: not supported here (got {value!r}). Instead, {entry.note}."
    given = "None" if str(value).strip() in ("null", "None", "~") else str(value).strip()  # YAML's and Hydra's null
    given = {"true": "True", "false": "False"}.get(given.lower(), given)  # Hydra's booleans, any case
    if entry.only is not None and given != entry.only:
        return [], None, f"{dotted}: only {entry.only} is supported here (got {value!r}): {entry.note}. Drop the key."
    if not entry.ours:
        return [], f"verl key {dotted} ignored: {entry.note}", None
    try:
        converted = entry.convert(value) if entry.convert else value
    except ValueError as err:  # a value the conversion cannot read (a file that is not there, ...)
        return [], None, f"{dotted}: {err} (got {value!r})."
    if converted is None:  # a value that sets nothing (e.g. enable_rollout_routing_replay=False)
        return [], f"verl key {dotted}={value} sets nothing: {entry.note}", None
    note = f"verl key {dotted} -> {', '.join(entry.ours)}"
    if entry.convert and str(converted) != str(value):
        note += f"={converted}"
    if entry.note and str(converted) != str(value):
        note += f" ({entry.note})"
    return [(ours, converted) for ours in entry.ours], note, None


def flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested YAML mapping -> [(dotted key, leaf value)].

    >>> flatten({"a": {"b": 1, "c": {"d": [2]}}, "e": 3})
    [('a.b', 1), ('a.c.d', [2]), ('e', 3)]
    """
    items = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            items += flatten(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def extract_verl(data: dict, our_keys) -> list[tuple[str, Any]]:
    """Remove the verl keys from a loaded YAML mapping (in place); return them, dotted, in file order."""
    found = [(k, v) for k, v in flatten(data) if is_verl_key(k, our_keys)]
    for dotted, _ in found:
        parts, node = dotted.split("."), data
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]
    _prune_empty(data)
    return found


def _prune_empty(node: dict) -> None:
    for key in list(node):
        if isinstance(node[key], dict):
            _prune_empty(node[key])
            if not node[key]:
                del node[key]


def markdown_table() -> str:
    """docs/verl.md's table: verl key | ours (or what happens)."""
    rows = ["| verl key | rlhf-mcore |", "|---|---|"]
    for key, entry in VERL_KEYS.items():
        shown = f"{key}*" if key.endswith(".") else key
        if entry.rejected:
            what = f"error: {entry.note}"
        elif not entry.ours:
            what = f"ignored: {entry.note}"
        else:
            what = ", ".join(f"`{k}`" for k in entry.ours) + (f" ({entry.note})" if entry.note else "")
        rows.append(f"| `{shown}` | {what} |")
    return "\n".join(rows)
