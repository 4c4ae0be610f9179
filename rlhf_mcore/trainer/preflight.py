"""Everything that can be checked before a model is built, checked at start-up on rank 0, one line per problem.

`preflight_errors(cfg)` covers what the config rules (`config.validate`) cannot see from the YAML alone:
paths that must exist, whether the rollout engine's own copy of the model fits one GPU, the data files
(parquet, verl's schema, every row), every data_source against the reward registry, and one probe call of
each reward per (data_source, ground-truth type) in a reward worker process with the call time-out. The
custom reward file is imported there, in that worker, never in the trainer.
"""
from __future__ import annotations

import os
from collections import defaultdict

from rlhf_mcore.data.fit import fit_errors
from rlhf_mcore.data.images import open_images
from rlhf_mcore.data.io import read_parquet_rows
from rlhf_mcore.data.schema import check_row
from rlhf_mcore.trainer.inputs import prompt_tools, vision_processor

MAX_ROW_LINES = 10  # row problems listed per file before "and N more"
PROBE_SOLUTION = "The answer is 0. #### 0 \\boxed{0}"  # answer formats the built-in rewards parse


def _path_errors(cfg) -> list[str]:
    m, errs = cfg.model, []
    paths = (("model.load", m.load, "a dist-checkpoint (tools/convert_checkpoint.py), or '' for hf_path's weights"),
             ("critic.load", cfg.critic.load, "a dist-checkpoint, or '' to start from the actor's weights"),
             ("ref.load", cfg.ref.load, "a dist-checkpoint, or '' for a frozen copy of the actor"),
             ("reward.model_path", cfg.reward.model_path, "an HF *ForSequenceClassification dir or a checkpoint"),
             ("model.tokenizer", "" if m.tokenizer == "bytes" else m.tokenizer, "a tokenizer dir or .model file"))
    for key, path, what in paths:
        if path and not os.path.exists(path):
            errs.append(f"{key}: not found (got {path!r}). Point it at {what}.")
    if not m.tokenizer and not m.hf_path:
        errs.append("model.tokenizer: no tokenizer (got ''). Set model.hf_path, model.tokenizer to a tokenizer dir "
                    "or .model file, or model.tokenizer=bytes for a tiny byte-level model.")
    if not errs:
        from rlhf_mcore.models.hf_load import weight_source

        try:
            weight_source(m)  # no silent random start: model.load, hf_path's weights, or model.init=random
        except ValueError as e:
            errs.append(str(e))
    resume = cfg.trainer.resume
    if resume not in ("auto", "disable", "restart") and not os.path.exists(resume):
        errs.append(f"trainer.resume: not found (got {resume!r}). Pass a global_step_N directory, 'auto', 'disable' "
                    "or 'restart'.")
    out = os.path.abspath(cfg.trainer.output_dir)
    parent = out
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        errs.append(f"trainer.output_dir: cannot be created or written (got {cfg.trainer.output_dir!r}; {parent} is "
                    "not a writable directory). Choose a writable location.")
    return errs


def _vocab_errors(cfg) -> list[str]:
    """The model's vocabulary must hold every id the tokenizer can produce."""
    from rlhf_mcore.models.registry import language_config
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.trainer.inputs import load_run_tokenizer

    try:
        tokenizer = load_run_tokenizer(cfg)
        vocab = language_config(load_hf_config(cfg.model))["vocab_size"]  # a vision LM nests it under text_config
    except Exception as e:  # noqa: BLE001 - reported as one line
        return [f"model.tokenizer: cannot load the tokenizer (got {cfg.model.tokenizer or cfg.model.hf_path!r}): "
                f"{type(e).__name__}: {e}."]
    if vocab < tokenizer.vocab_size:
        key = "model.vocab_size" if cfg.model.vocab_size is not None else f"{cfg.model.hf_path}/config.json vocab_size"
        return [f"{key}: below the tokenizer's {tokenizer.vocab_size} ids (got {vocab}). Set it to at least "
                f"{tokenizer.vocab_size}."]
    return []


def engine_model_size(hf_config: dict, bytes_per_value: int) -> tuple[int, int]:
    """(parameters, KV-cache bytes per token) of the model a rollout engine holds: the whole config.json's model,
    a vision LM's tower included; the KV cache is its language model's."""
    from rlhf_mcore.models.full_weights import kv_bytes_per_token, num_params
    from rlhf_mcore.models.registry import language_config
    from rlhf_mcore.plan.params import vision_params

    lm = language_config(hf_config)  # a vision LM nests the LM's fields under text_config
    return num_params(lm) + vision_params(hf_config), kv_bytes_per_token(lm, bytes_per_value)


def _engine_memory_errors(cfg) -> list[str]:
    """The rollout engine's own copy of the model must fit one GPU (asked of the engine), and an engine that
    declared needs_cuda needs one."""
    import torch

    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES, engine_options

    engine = cfg.rollout.engine
    if not torch.cuda.is_available():
        return [f"rollout.engine: {engine} needs a CUDA GPU (got {engine} on a machine without CUDA). Use "
                "rollout.engine=native."] if ROLLOUT_ENGINES.traits(engine).needs_cuda else []
    nbytes = 2 if cfg.model.dtype == "bf16" else 4
    params, kv_per_token = engine_model_size(load_hf_config(cfg.model), nbytes)
    seq = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    device = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return ROLLOUT_ENGINES.get(cfg.rollout.engine).memory_errors(
        engine_options(cfg.rollout), params, nbytes, device, kv_per_token * seq)


def _rows(key: str, path: str) -> tuple[list, list[str]]:
    """(validated rows, problems) of one data file."""
    try:
        records = read_parquet_rows(path)
    except ValueError as e:
        return [], [f"data.{key}: {e}"]
    rows, problems = [], []
    for i, record in enumerate(records):
        try:
            row = check_row(record, f"data.{key}: {path}: row {i}", i)
            open_images(row.images, f"data.{key}: {path}: row {i}", os.path.dirname(path))  # every image decodes
            rows.append(row)
        except ValueError as e:
            problems.append(str(e))
    if len(problems) > MAX_ROW_LINES:
        problems = problems[:MAX_ROW_LINES] + [f"data.{key}: {path}: and {len(problems) - MAX_ROW_LINES} more "
                                               "malformed rows. Fix the rows above (verl's schema) and re-run."]
    return rows, problems


def _source_errors(key: str, path: str, rows: list) -> list[str]:
    from rlhf_mcore.rewards.dispatch import has_reward, known_sources

    by_source = defaultdict(list)
    for row in rows:
        by_source[row.data_source].append(row.index)
    errs = []
    for source, indices in sorted(by_source.items()):
        if not has_reward(source):
            more = f" and {len(indices) - 1} more rows" if len(indices) > 1 else ""
            errs.append(f"data.{key}: {path}: row {indices[0]}{more}: data_source {source!r} has no reward function "
                        f"(registered: {', '.join(known_sources())}). Register one with @register_reward"
                        f"({source!r}) or set reward.custom_fn.")
    return errs


def _probe_errors(cfg, probes: list[tuple[str, str, object]]) -> list[str]:
    """One call of each reward in a worker process under reward.timeout_s; [] when every call returns a score."""
    from rlhf_mcore.rewards import RewardPool, get_reward_fn

    r = cfg.reward
    tasks = [(r.custom_fn or get_reward_fn(row.data_source), row.data_source, PROBE_SOLUTION, row.ground_truth,
              row.extra_info) for _, _, row in probes]
    errs = []
    with RewardPool(1) as pool:
        for (key, path, row), task in zip(probes, tasks):
            errs += _probe_problem(cfg, key, path, row, pool.run([task], timeout_s=r.timeout_s)[0])
            if errs and errs[-1].startswith("reward.custom_fn"):  # the file itself is broken: one line is enough
                return errs[-1:]
    return errs


def _probe_problem(cfg, key: str, path: str, row, outcome) -> list[str]:
    r = cfg.reward
    if outcome[0] == "ok":
        return []
    what = f"reward.custom_fn: {r.custom_fn}" if r.custom_fn else f"the reward of data_source {row.data_source!r}"
    if outcome[0] == "timeout" or "worker died" in outcome[1]:
        cause = f"timed out after reward.timeout_s={r.timeout_s:g} s" if outcome[0] == "timeout" else outcome[1]
        return [f"{what}: importing or calling it {cause} (probe on data.{key} {path} row {row.index}). Keep "
                "module-level code fast, never exit the process, or raise reward.timeout_s."]
    if r.custom_fn and "custom reward:" in outcome[1]:
        return [f"reward.custom_fn: {outcome[1].split('custom reward: ', 1)[1]}"]
    gt = f"{type(row.ground_truth).__name__} {row.ground_truth!r}"[:80]
    return [f"data.{key}: {path}: row {row.index}: {what} fails on this row (ground_truth {gt}): {outcome[1]}. "
            "Store ground_truth the way the reward expects (e.g. as a string)."]


def _tokenizer(cfg) -> tuple[object | None, list[str]]:
    from rlhf_mcore.trainer.inputs import load_run_tokenizer

    try:
        return load_run_tokenizer(cfg), []
    except Exception as e:  # noqa: BLE001 - reported as one line
        return None, [f"model.tokenizer: cannot load the tokenizer (got {cfg.model.tokenizer or cfg.model.hf_path!r}): "
                      f"{type(e).__name__}: {e}."]


def _data_errors(cfg, tokenizer) -> tuple[list[str], list]:
    """(problems of the data files: schema, rows, data sources, enough prompts that fit; reward probes to run)."""
    errs, probes = [], []
    try:
        processor = vision_processor(cfg)
    except ValueError as e:
        return [str(e)], []
    if not cfg.data.train_files.replace(",", "").strip():
        errs.append(f"data.train_files: required: the training prompts (got {cfg.data.train_files!r}). Point it at "
                    "verl-schema parquet files (tools/prepare_gsm8k.py writes them), comma-separated.")
    for key in ("train_files", "val_files"):
        key_errs, fitting, paths = [], [], [p for p in map(str.strip, getattr(cfg.data, key).split(",")) if p]
        for path in paths:
            rows, problems = _rows(key, path)
            key_errs += problems + ([] if cfg.reward.custom_fn else _source_errors(key, path, rows))
            probes += [(key, path, row) for row in rows]
            fitting += [(path, row) for row in rows]
        errs += key_errs
        if tokenizer is not None and paths and not key_errs:
            train = key == "train_files"
            errs += fit_errors(f"data.{key}", getattr(cfg.data, key), fitting, tokenizer, cfg.data.max_prompt_length,
                               need=cfg.data.train_batch_size if train else 1,
                               filter_overlong=cfg.data.filter_overlong_prompts, tools=prompt_tools(cfg),
                               what="a batch (data.train_batch_size)" if train else "validation",
                               processor=processor)
    return errs, probes


def static_errors(cfg) -> tuple[list[str], list]:
    """(what needs no model, GPU or worker process: paths, the tokenizer, the data files, which --validate-only
    checks too; the reward probes to run after)."""
    errs = _path_errors(cfg)
    tokenizer, tok_errs = _tokenizer(cfg) if not errs else (None, [])
    data_errs, probes = _data_errors(cfg, tokenizer)
    return errs + tok_errs + data_errs, probes


def preflight_errors(cfg) -> list[str]:
    """Every problem found without building a model, one line each (empty: ready to start)."""
    errs, probes = static_errors(cfg)
    if not errs:
        errs += _vocab_errors(cfg)
    if not errs:
        errs += _engine_memory_errors(cfg)
    if not errs:
        errs += memory_plan_errors(cfg)
    first = {}
    for probe in probes:  # one per (data_source, ground-truth type) over all files
        first.setdefault((probe[2].data_source, type(probe[2].ground_truth).__name__), probe)
    probes = list(first.values())
    if not errs and probes:
        errs += _probe_errors(cfg, probes)
    return errs + _sandbox_errors(cfg)


# the cheapest fix of each memory-plan term (rlhf_mcore.plan.phases), named when that term tops a phase too large
PLAN_FIXES = {
    "activations": "lower actor.max_tokens_per_gpu (or micro_batch_size_per_gpu), or set model.recompute=full",
    "logprob": "lower actor.max_tokens_per_gpu (the fused log-prob kernel's chunk follows it)",
    "kv_cache": "set rollout.micro_batch_size to decode fewer rows at once, or a larger parallel.tp",
    "decode_logits": "set rollout.micro_batch_size to decode fewer rows at once",
    "prefill": "set rollout.micro_batch_size to prefill fewer rows at once",
    "rollout_cache": "set rollout.native.keep_graphs=false (the decoder's cache is freed after each rollout)",
    "merged_lora": "set rollout.native.keep_graphs=false, or rollout.native.cuda_graphs=false (no merged copy)",
    "head": "lower actor.max_tokens_per_gpu (or micro_batch_size_per_gpu)",
    "sglang": "lower rollout.sglang.gpu_memory_utilization",
    "grads+optimizer": "set parallel.use_distributed_optimizer=true over more DP ranks, trainer.offload_during_rollout"
                       "=true, or a larger parallel.tp / parallel.pp",
    "weights": "use a larger parallel.tp or parallel.pp (or model.lora_rank for a frozen base)",
}
PLAN_MARGIN = 0.08  # a plan over the device by more than this fraction stops the run


def memory_plan_errors(cfg, device_bytes: float | None = None) -> list[str]:
    """On a GPU: one line when the memory plan's peak per rank (rlhf_mcore.plan) exceeds the device's memory by
    more than PLAN_MARGIN, naming the phase, its largest term and that term's cheapest fix."""
    import torch

    if not cfg.trainer.check_memory_plan or (device_bytes is None and not torch.cuda.is_available()):
        return []
    from rlhf_mcore.plan.phases import as_engine_runs, run_plan

    device_bytes = device_bytes or torch.cuda.get_device_properties(0).total_memory
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg, _ = as_engine_runs(cfg, device_bytes, world)  # e.g. its decoder cache freed on a tight device
    plan = run_plan(cfg, world, device_bytes)
    if plan.total <= device_bytes * (1 + PLAN_MARGIN):
        return []
    term = max(plan.terms, key=plan.terms.get)
    gib = 2**30
    return [f"memory plan: the {plan.phase} phase needs {plan.total / gib:.1f} GiB per rank on a "
            f"{device_bytes / gib:.1f} GiB device ({term} {plan.terms[term] / gib:.1f} GiB; python -m rlhf_mcore.plan "
            f"shows every term and layout). Cheapest fix: {PLAN_FIXES[term]}; or set trainer.check_memory_plan=false "
            "to start anyway."]


def _sandbox_errors(cfg) -> list[str]:
    """Sandboxed tools (the python tool) on a host that cannot contain them: one line."""
    m = cfg.rollout.multi_turn
    if cfg.rollout.mode != "multi_turn":
        return []
    from rlhf_mcore.agent.containment import containment_errors
    from rlhf_mcore.agent.tools import load_tools

    try:
        tools = load_tools(list(m.tools), m.tools_file or None)
    except ValueError:
        return []  # the config rules name a bad tool
    return containment_errors(sorted(n for n, t in tools.items() if t.sandboxed), m.allow_weak_sandbox)
