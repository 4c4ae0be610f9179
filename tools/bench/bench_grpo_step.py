"""One GRPO step at a fixed shape, our trainer's real `train_step`, per rollout engine; plus a combine mode
that puts ours and TRL's (tools/bench/bench_trl_grpo.py, same shape, same machine) in one JSON and table.

    python -m tools.bench.bench_grpo_step --engine native --out results/      # one H200: ~1 min
    python -m tools.bench.bench_grpo_step --engine sglang --out results/      # + SGLang start-up
    python -m tools.bench.bench_grpo_step --combine results/ --out results/   # -> grpo_step_<preset>.json
    python -m tools.bench.bench_grpo_step --tiny --engine native             # CPU dry run, seconds
    torchrun --nproc_per_node 2 -m tools.bench.bench_grpo_step --engine sglang --tp 2 --out results/  # layouts

Shape (issue 8): random Qwen2.5-0.5B shape, bf16, 64 prompts x 8 samples x 256 new tokens, 128-token
prompts, one optimizer step per step (ppo_mini_batch_size = train_batch_size, one epoch: on-policy), no
KL, GRPO, random rewards. No stop tokens, so every response has exactly 256 tokens (runs are comparable).
Reported: per-phase seconds (median of the timed steps), tokens/s, peak memory, rollout-vs-trainer
log-prob mismatch (`rollout/mismatch_*`), MFU of the log-prob + update phases, and a standalone rollout
(512 x 256 with log-probs; prefill-only call for ms per decode step). `--hf-path DIR` takes the architecture
from DIR/config.json instead (random weights; e.g. a Qwen3-MoE shape, `--moe-expert-impl`; MFU counts the
active experts). `--router-replay R2|R3` (actor.router_replay, an MoE --hf-path; issue 40: tools/gpu/gpu_r3.sh
compares the modes) adds the update's own MFU next to the mismatch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Optional

import torch

from rlhf_mcore.algorithms import KL_CONTROLLERS
from rlhf_mcore.config import (
    ActorConfig,
    AlgorithmConfig,
    Config,
    CriticConfig,
    DataConfig,
    ModelConfig,
    NativeRolloutConfig,
    OptimConfig,
    ParallelConfig,
    RolloutConfig,
    SGLangRolloutConfig,
    TrainerConfig,
)
from rlhf_mcore.config.load import from_dict, to_dict
from rlhf_mcore.config.validate import validate
from rlhf_mcore.logs import MetricLogger, init_logger
from rlhf_mcore.models.flops import forward_flops_per_token
from rlhf_mcore.models.registry import language_config
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed, torchrun_env
from rlhf_mcore.rollout import static_decode
from rlhf_mcore.rollout.base import build_rollout_engine
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer import loop as trainer
from rlhf_mcore.trainer.roles import build_roles
from rlhf_mcore.trainer.run import Run, engine_setup
from rlhf_mcore.trainer.scoring import Scored
from rlhf_mcore.trainer.step_log import peak_memory_gb
from tools.bench import vision_bench
from tools.bench.memory_plan_check import compare as compare_plan
from tools.bench.memory_plan_check import print_comparison, trainer_peaks

QWEN = dict(family="qwen2", num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14,
            num_query_groups=2, vocab_size=151936, tie_embeddings=True, dtype="bf16")
TINY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
            vocab_size=300, dtype="fp32")
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync_weights")
PEAK_TFLOPS = 790.0  # measured bf16 dense matmul rate of the H200 (benchmarks/2026-11-30-training-step)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="native", choices=["native", "sglang"])
    p.add_argument("--tiny", action="store_true", help="tiny fp32 model, 4 prompts x 2 x 8 tokens (CPU dry run)")
    p.add_argument("--prompts", type=int, default=64, help="prompts per step, all DP ranks together")
    p.add_argument("--tp", type=int, default=1, help="parallel.tp (launch tp*pp*dp ranks with torchrun)")
    p.add_argument("--pp", type=int, default=1, help="parallel.pp")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=64,
                   help="actor.micro_batch_size_per_gpu (64: 46%% MFU on an H200, 32: 43%%)")
    p.add_argument("--max-tokens", type=int, default=0,
                   help=">0: token-budget micro-batches (actor.use_dynamic_bsz, actor.max_tokens_per_gpu)")
    p.add_argument("--mini-batches", type=int, default=1,
                   help="optimizer steps a step (mini-batch = prompts / this; > 1 runs the old-log-prob pass)")
    p.add_argument("--kl-loss", type=int, default=0, help="1: actor.use_kl_loss (a reference model and its pass)")
    p.add_argument("--pack", type=int, default=0, help="1: data.use_sequence_packing (under --max-tokens)")
    p.add_argument("--log-prob-max-tokens", type=int, default=0, help="actor.log_prob_max_tokens_per_gpu")
    p.add_argument("--sdpa-kernel", default="auto", help="model.sdpa_kernel (auto|flash|cudnn|efficient)")
    p.add_argument("--hf-path", default="", help="the architecture from this HF dir's config.json (random bf16 "
                   "weights, e.g. an MoE shape) instead of the Qwen2.5-0.5B shape")
    p.add_argument("--images", type=int, default=0, help="a vision --hf-path: images per prompt (random noise, "
                   "--image-side pixels square; tools/bench/vision_bench.py), inside --prompt-len")
    p.add_argument("--image-side", type=int, default=448, help="the images' side in pixels (448: 256 LM tokens)")
    p.add_argument("--moe-expert-impl", default="auto", help="model.moe_expert_impl of an MoE --hf-path")
    p.add_argument("--router-replay", default="disabled", choices=["disabled", "R2", "R3"],
                   help="actor.router_replay of an MoE --hf-path (R3 decodes eagerly: compare with --cuda-graphs 0)")
    p.add_argument("--gpu-init", type=int, default=0,
                   help="1: draw the random weights on the GPU (seconds for billions of parameters; not layout-exact)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--attention-backend", default="triton", help="rollout.sglang.attention_backend")
    p.add_argument("--cuda-graphs", type=int, default=1, help="rollout.native.cuda_graphs")
    p.add_argument("--compile-decode", type=int, default=1, help="rollout.native.compile_decode")
    p.add_argument("--decode-attention", default="auto", help="rollout.native.decode_attention (auto|triton|sdpa)")
    p.add_argument("--exact-casts", type=int, default=1,
                   help="0: let inductor keep fused bf16 intermediates in fp32 (static_decode.INDUCTOR_OPTIONS)")
    p.add_argument("--fp32-lm-head", type=int, default=0, help="rollout.sglang.fp32_lm_head")
    p.add_argument("--swiglu-fusion", type=int, default=1,
                   help="0: turn megatron's compiled SwiGLU (bias_activation_fusion, on by default on a GPU) off")
    p.add_argument("--standalone", type=int, default=1, help="0: skip the standalone rollout timing")
    p.add_argument("--profile-rollout", default="", help="write a torch.profiler table of a 512 x 17 rollout here")
    p.add_argument("--profile", default="", help="write a torch.profiler table of one step to this file")
    p.add_argument("--combine", default="", help="directory of grpo_step_part_*.json to merge")
    p.add_argument("--combined-name", default="grpo_step_qwen2.5-0.5b.json", help="file name of the merged JSON")
    p.add_argument("--out", default="", help="directory for the JSON result")
    p.add_argument("--label", default="", help="a name for this variant: system ours-<engine>-<label>, its own file")
    p.add_argument("--set", action="append", default=[], metavar="A.B=VALUE",
                   help="a config override on top of the flags' config (repeatable), e.g. --set model.lora_rank=32")
    return p.parse_args(argv)


def build_config(args) -> Config:
    if args.tiny:
        args.prompts, args.n, args.prompt_len, args.new_tokens, args.micro_batch = 4, 2, 12, 8, 4
    rollout = RolloutConfig(engine=args.engine, n=args.n, max_response_length=args.new_tokens, temperature=1.0,
                            native=NativeRolloutConfig(cuda_graphs=bool(args.cuda_graphs),
                                                       compile_decode=bool(args.compile_decode),
                                                       decode_attention=args.decode_attention),
                            sglang=SGLangRolloutConfig(attention_backend=args.attention_backend,
                                                       fp32_lm_head=bool(args.fp32_lm_head),
                                                       gpu_memory_utilization=0.5))
    batching = dict(ppo_mini_batch_size=args.prompts // args.mini_batches, micro_batch_size_per_gpu=args.micro_batch,
                    use_dynamic_bsz=args.max_tokens > 0, max_tokens_per_gpu=args.max_tokens)
    actor = ActorConfig(optim=OptimConfig(lr=1e-6), use_kl_loss=bool(args.kl_loss),
                        log_prob_max_tokens_per_gpu=args.log_prob_max_tokens, router_replay=args.router_replay,
                        **batching)
    critic = CriticConfig(**batching)  # a critic (--set algorithm.adv_estimator=gae) batches as the actor, as verl's
    model = ModelConfig(**model_shape(args), sdpa_kernel=args.sdpa_kernel)
    cfg = Config(model=model, rollout=rollout, actor=actor, critic=critic,
                 algorithm=AlgorithmConfig(adv_estimator="grpo"),  # the default is verl's gae (a critic)
                 parallel=ParallelConfig(tp=args.tp, pp=args.pp),
                 data=DataConfig(train_batch_size=args.prompts, max_prompt_length=args.prompt_len,
                                 use_sequence_packing=bool(args.pack)),
                 trainer=TrainerConfig(seed=1, logger=[], total_steps=1000))
    return from_dict(to_dict(cfg), args.set) if args.set else cfg


def model_shape(args) -> dict:
    """The model section's architecture fields: --hf-path's config.json (random weights), or the fixed shape."""
    if args.hf_path:
        return dict(hf_path=args.hf_path, init="random", dtype="fp32" if args.tiny else "bf16",
                    moe_expert_impl=args.moe_expert_impl)
    return TINY if args.tiny else QWEN


class RandomPrompts:
    """The sampler: `num` prompts of `length` random token ids per step for one DP rank (seeded by step and
    DP rank; DP rank 0 draws what a one-GPU run draws)."""

    def __init__(self, num: int, length: int, vocab: int, dp_rank: int = 0):
        self.num, self.length, self.vocab, self.step, self.dp_rank = num, length, vocab, 0, dp_rank

    def next_batch(self):
        g = torch.Generator().manual_seed(self.step + 1000 * self.dp_rank)
        self.step += 1
        ids = torch.randint(10, self.vocab, (self.num, self.length), generator=g).tolist()
        return [types.SimpleNamespace(prompt_ids=p) for p in ids]


class RandomScores:
    """The run's scorer (`trainer.scoring.Scorer`'s `score_step`): rewards in [0, 1) drawn per sample (GRPO needs
    spread within a group, not meaning); no accuracy or format."""

    def score_step(self, rollout, prompts, n: int) -> tuple[Scored, dict]:
        g = torch.Generator().manual_seed(int(rollout.tokens[:, -1].sum()) % 2**31)
        scores = torch.rand(rollout.tokens.size(0), generator=g)  # [B]
        zeros = torch.zeros_like(scores)
        return Scored(scores.to(rollout.tokens.device), zeros, zeros, 0.0, 0.0, raw=scores), {}


def build_run(cfg, ctx, args) -> Run:
    errors = validate(cfg, ctx.dims.world_size)
    if errors:
        raise ValueError("\n".join(errors))
    hf = load_hf_config(cfg.model)
    with random_weights_on_gpu(args.gpu_init), vision_bench.tower_on_gpu(bool(args.gpu_init)):
        roles = build_roles(cfg, hf, ctx)
    if not args.swiglu_fusion:  # A/B of megatron's torch.compile'd SwiGLU (its MLP reads the flag per call)
        roles.actor.model[0].config.bias_activation_fusion = False
    tokenizer = types.SimpleNamespace(pad_id=0, decode=None)
    start = time.perf_counter()
    setup = engine_setup(cfg, roles, hf, tokenizer, ctx)
    engine = build_rollout_engine(cfg.rollout, setup)
    if setup.release_cache:  # the engine frees its decoder cache (logged): the plan compared below does too
        cfg.rollout.native.keep_graphs = False
    run = Run(cfg=cfg, ctx=ctx, roles=roles, engine=engine, tokenizer=tokenizer, stop_ids=(),
              sampler=sampler(args, cfg, hf, ctx),
              val_sampler=None, scorer=RandomScores(), kl_ctrl=KL_CONTROLLERS.get("fixed")(value=0.0),
              total_steps=1 << 30, run_dir=tempfile.mkdtemp(), metric_logger=MetricLogger("", [], False))
    run.engine_start_s = time.perf_counter() - start
    return run


def sampler(args, cfg, hf: dict, ctx):
    """Random token prompts, or with --images prompts carrying images (`vision_bench.ImagePrompts`)."""
    num, length = cfg.data.train_batch_size // ctx.dims.dp, cfg.data.max_prompt_length
    if args.images:
        return vision_bench.ImagePrompts(num, length, hf, args.images, args.image_side, ctx.dp_rank)
    return RandomPrompts(num, length, language_config(hf)["vocab_size"], ctx.dp_rank)


def random_weights_on_gpu(enabled: int):
    """bench_lora_step.gpu_initialization where asked for and a GPU is there, else nothing."""
    import contextlib

    if not (enabled and torch.cuda.is_available()):
        return contextlib.nullcontext()
    from tools.bench.bench_lora_step import gpu_initialization

    return gpu_initialization()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_step(run, step: int) -> dict:
    sync()
    start = time.perf_counter()
    metrics = trainer.train_step(run, step)
    sync()
    metrics["timing_s/step"] = time.perf_counter() - start
    return metrics


def standalone_rollout(run, args) -> dict:
    """512 x 256 (the step's rollout) alone, with log-probs: best of two, and a prefill-only call. SGLang's
    prefix cache is flushed before each call (prompts are new in every step); its A/B rows: the prompts
    cached from the call before, each row prefilling its whole prompt, no log-probs (straight through
    sglang.Engine.generate: what SGLang's scheduler costs per token for them), the weight refresh tensor by
    tensor."""
    prompts = [list(p.prompt_ids) for p in run.sampler.next_batch()]
    sglang = args.engine == "sglang"

    def generate(max_new: int) -> None:
        run.engine.generate(prompts, SamplingParams(n=args.n, max_new_tokens=max_new, temperature=1.0, seed=3))

    def best(max_new: int, flush: bool = sglang, call=generate) -> float:
        times = []
        for _ in range(2):  # train_step left the engine resumed, with the current weights
            if flush:
                run.engine.engine.flush_cache()
            sync()
            start = time.perf_counter()
            call(max_new)
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    full, prefill = best(args.new_tokens), best(1)
    result = {"weight_refresh_s": time_weight_refresh(run), "rollout_s": full, "prefill_s": prefill,
              "ms_per_decode_step": 1e3 * (full - prefill) / max(args.new_tokens - 1, 1),
              "rollout_tok_s": args.prompts * args.n * args.new_tokens / full,
              "rollout_gpu_busy": gpu_busy(lambda: best(args.new_tokens))}
    if sglang:
        result["rollout_prompts_cached_s"] = best(args.new_tokens, flush=False)
        run.engine.prefill_prompts_once = False
        result["rollout_each_row_prefills_s"] = best(args.new_tokens)
        result["prefill_each_row_prefills_s"] = best(1)
        run.engine.prefill_prompts_once = True
        no_logprobs = without_logprobs(run.engine.engine, prompts, args.n)
        result["rollout_no_logprobs_s"] = best(args.new_tokens, call=no_logprobs)
        result["rollout_no_logprobs_gpu_busy"] = gpu_busy(lambda: best(args.new_tokens, call=no_logprobs))
        encode, run.engine.encode = run.engine.encode, None
        result["weight_refresh_tensors_s"] = time_weight_refresh(run)
        run.engine.encode = encode
    return result


def without_logprobs(server, prompts: list[list[int]], n: int):
    """max_new -> the rollout straight through sglang.Engine.generate, without log-probs."""
    from rlhf_mcore.rollout.sglang_engine import sglang_sampling

    rows = [p for p in prompts for _ in range(n)]

    def call(max_new: int) -> None:
        server.generate(input_ids=rows, sampling_params=sglang_sampling(SamplingParams(
            n=n, max_new_tokens=max_new, temperature=1.0)), return_logprob=False)
    return call


def gpu_busy(fn) -> Optional[float]:
    """The share of time the GPU ran a kernel while fn() ran (NVML's utilization, sampled every 20 ms and
    averaged; it counts the other processes on the GPU too, e.g. SGLang's scheduler); None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 (no NVML here: the figure is simply not available)
        return None
    samples, done = [], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return sum(samples) / len(samples) / 100 if samples else None


def time_weight_refresh(run) -> float:
    """The weight refresh alone (update_weights on a resumed engine, no resume / release): best of 3."""
    times = []
    for _ in range(3):
        sync()
        start = time.perf_counter()
        run.engine.update_weights(run.roles.actor.model[0])
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def profile_rollout(run, args, path: str) -> None:
    """torch.profiler table of one standalone rollout of 17 tokens (16 graphed decode steps)."""
    from torch.profiler import ProfilerActivity, profile

    prompts = [list(p.prompt_ids) for p in run.sampler.next_batch()]
    params = SamplingParams(n=args.n, max_new_tokens=17, temperature=1.0, seed=3)
    run.engine.generate(prompts, params)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run.engine.generate(prompts, params)
        sync()
    Path(path).write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40))


def train_flops(hf: dict, rows: int, seq: int, passes: float) -> float:
    """Model FLOPs of `passes` forward-equivalents (fwd = 1, fwd + bwd = 3) over rows x seq tokens (MoE: the
    active experts), at the mean causal context of seq / 2."""
    return passes * forward_flops_per_token(hf, seq / 2) * rows * seq


def summarize(args, cfg, run, steps: list[dict], rollout: dict) -> dict:
    med = {k: statistics.median(s.get(f"timing_s/{k}", 0.0) for s in steps) for k in PHASES + ("step",)}
    full_hf = load_hf_config(cfg.model)
    hf = language_config(full_hf)  # a vision LM's LM; its tower's FLOPs are added below (--images)
    rows, seq = args.prompts * args.n, args.prompt_len + args.new_tokens
    passes = 3.0 + sum(1.0 for p in ("old_log_prob", "ref") if med[p] > 0.05)  # update fwd+bwd, + forward passes
    train_s = med["old_log_prob"] + med["ref"] + med["update_actor"]
    tower = vision_bench.tower_step_flops(full_hf, args.prompts, args.images, args.image_side, passes,
                                          not cfg.model.freeze_vision_tower) if args.images else 0.0
    last = steps[-1]
    peaks, device_used = trainer_peaks(steps), trainer_peaks(steps, "perf/device_used_gb/")
    gpu_gib = torch.cuda.mem_get_info()[1] / 2**30 if torch.cuda.is_available() else 0.0  # SGLang's fraction of it
    return {
        "system": f"ours-{args.engine}" + (f"-{args.label}" if args.label else ""), "engine": args.engine,
        "step_s": med["step"], "phases_s": med,
        "steps_s": [s["timing_s/step"] for s in steps], "tokens_per_s": rows * seq / med["step"],
        "peak_mem_gib": peak_memory_gb() if torch.cuda.is_available() else None,  # the run's (phases reset theirs)
        "mismatch": {k: last.get(k) for k in ("rollout/mismatch_logp_abs_diff", "rollout/mismatch_kl_k1",
                                              "rollout/mismatch_kl_k3", "rollout/mismatch_first_abs_diff",
                                              "rollout/mismatch_exact_frac")},
        "logprob_update_mfu": (train_flops(hf, rows, seq, passes) + tower) / max(train_s, 1e-9) / (PEAK_TFLOPS * 1e12),
        "logprob_update_mfu_lm_only": train_flops(hf, rows, seq, passes) / max(train_s, 1e-9) / (PEAK_TFLOPS * 1e12),
        "tower_tflop_per_step": tower / 1e12, "images_per_prompt": args.images, "image_side": args.image_side,
        "rollout_tok_s_in_step": rows * args.new_tokens / max(med["gen"], 1e-9),
        "update_mfu": train_flops(hf, rows, seq, 3.0) / max(med["update_actor"], 1e-9) / (PEAK_TFLOPS * 1e12),
        "router_replay": cfg.actor.router_replay,
        "engine_start_s": run.engine_start_s, "rollout": rollout,
        "weight_sync_gb": last.get("perf/weight_sync_gb"), "weight_reshard_gb": last.get("perf/weight_reshard_gb"),
        "shape": {"prompts": args.prompts, "n": args.n, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                  "micro_batch": args.micro_batch, "max_tokens": args.max_tokens, "pack": bool(args.pack),
                  "log_prob_max_tokens": args.log_prob_max_tokens, "dtype": cfg.model.dtype, "tiny": args.tiny,
                  "hf_path": args.hf_path, "moe_expert_impl": args.moe_expert_impl if args.hf_path else None},
        "config": {"attention_backend": cfg.rollout.sglang.attention_backend,
                   "cuda_graphs": cfg.rollout.native.cuda_graphs, "compile_decode": cfg.rollout.native.compile_decode,
                   "decode_attention": getattr(getattr(run.engine, "static", None), "attention_name", None),
                   "fp32_lm_head": cfg.rollout.sglang.fp32_lm_head, "swiglu_fusion": bool(args.swiglu_fusion),
                   "exact_casts": bool(args.exact_casts)},
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "memory_plan": compare_plan(cfg, hf, peaks, gpu_gib * 2**30, device_used),  # rlhf_mcore.plan vs measured
        "label": args.label, "overrides": list(args.set),
        "plan_input": {"config": to_dict(cfg), "hf": hf, "phase_peaks_gib": peaks,  # memory_plan_check --repredict
                       "gpu_memory_gib": gpu_gib, "device_used_gib": device_used},
    }


def profile_step(run, step: int, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        timed_step(run, step)
    key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(prof.key_averages().table(sort_by=key, row_limit=40))


def bench(args) -> dict:
    init_logger(torchrun_env()[0])
    cfg = build_config(args)
    if not args.exact_casts:  # A/B of the rollout-vs-trainer mismatch of the compiled decode step
        static_decode.INDUCTOR_OPTIONS = {}
    ctx = init_distributed(args.tp, args.pp, seed=cfg.trainer.seed)
    run = build_run(cfg, ctx, args)
    steps = []
    for step in range(args.warmup + args.steps):
        metrics = timed_step(run, step)
        if step >= args.warmup:
            steps.append(metrics)
        print(f"[{args.engine}] step {step}: " + " ".join(f"{p} {metrics.get(f'timing_s/{p}', 0):.3f}"
                                                          for p in PHASES + ("step",)), flush=True)
    if args.profile:
        profile_step(run, args.warmup + args.steps, args.profile)
    if args.profile_rollout:
        profile_rollout(run, args, args.profile_rollout)
    result = summarize(args, cfg, run, steps, standalone_rollout(run, args) if args.standalone else {})
    print_comparison(result["system"], result["memory_plan"])
    run.engine.shutdown()
    return result


def print_table(systems: list[dict]) -> None:
    print(f"{'system':<22}{'step s':>8}{'gen s':>8}{'logp s':>8}{'update s':>9}{'sync s':>8}{'tok/s':>9}"
          f"{'rollout s':>10}{'ms/dec':>8}{'mismatch':>10}{'exact':>7}{'MFU':>7}{'mem GiB':>9}")
    for s in systems:
        ph, ro = s.get("phases_s", {}), s.get("rollout", {})

        def f(v, fmt):
            return format(v, fmt) if isinstance(v, (int, float)) else "-".rjust(int(fmt.rstrip("f%").split(".")[0]))
        print(f"{s['system']:<22}{f(s['step_s'], '8.3f')}{f(ph.get('gen'), '8.3f')}{f(ph.get('old_log_prob'), '8.3f')}"
              f"{f(ph.get('update_actor', ph.get('train')), '9.3f')}{f(ph.get('sync_weights'), '8.3f')}"
              f"{f(s.get('tokens_per_s'), '9.0f')}{f(ro.get('rollout_s'), '10.3f')}"
              f"{f(ro.get('ms_per_decode_step'), '8.2f')}"
              f"{f(s.get('mismatch', {}).get('rollout/mismatch_logp_abs_diff'), '10.5f')}"
              f"{f(s.get('mismatch', {}).get('rollout/mismatch_exact_frac'), '7.1%')}"
              f"{f(s.get('logprob_update_mfu'), '7.1%')}{f(s.get('peak_mem_gib'), '9.1f')}")


def combine(directory: str, out: str, name: str = "grpo_step_qwen2.5-0.5b.json") -> None:
    """Every grpo_step_part_*.json of `directory` in one table, with each system's speed-up over TRL's and verl's
    step where their parts are there (tools/bench/bench_trl_grpo.py, tools/bench/bench_verl_grpo.py)."""
    parts = [json.loads(p.read_text()) for p in sorted(Path(directory).glob("grpo_step_part_*.json"))]
    baselines = {b: next((p for p in parts if p["system"].startswith(b)), None) for b in ("trl", "verl")}
    for b, base in baselines.items():
        for p in parts:
            p[f"speedup_vs_{b}"] = base["step_s"] / p["step_s"] if base else None
    print_table(parts)
    for b, base in baselines.items():
        if base:
            print(f"speed-up vs {b}: " + ", ".join(f"{p['system']} {p[f'speedup_vs_{b}']:.2f}x" for p in parts))
    if out:
        path = Path(out) / name
        path.write_text(json.dumps({"systems": parts, "baseline": baselines["trl"] and baselines["trl"]["system"],
                                    "baselines": {b: base and base["system"] for b, base in baselines.items()}},
                                   indent=2))
        print(f"wrote {path}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out, args.combined_name)
    result = bench(args)
    if torchrun_env()[0] != 0:
        return
    world = torchrun_env()[2]
    result["layout"] = {"tp": args.tp, "pp": args.pp, "dp": world // (args.tp * args.pp)}
    print_table([result])
    for key, value in result["rollout"].items():
        print(f"standalone {key}: {value if value is None else round(value, 4)}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        layout = f"_tp{args.tp}pp{args.pp}dp{world // (args.tp * args.pp)}" if world > 1 else ""
        label = f"_{args.label}" if args.label else ""
        path = Path(args.out) / f"grpo_step_part_{args.engine}{label}{layout}{'_tiny' if args.tiny else ''}.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
