"""verl itself on our two benchmark jobs, on the same GPU as ours (issue 41).

    python -m tools.bench.bench_verl_grpo prepare --dir /tmp/verl_step            # the step job's model and data
    python -m tools.bench.bench_verl_grpo run --job step --dir /tmp/verl_step --out results/
    python -m tools.bench.bench_verl_grpo run --job gsm8k --model HF --data GSM8K --minutes 5 --out results/
    python -m tools.bench.bench_verl_grpo compare --out results/                  # the real job: verl vs ours
    python -m tools.bench.bench_verl_grpo --dry-run                               # CPU: no verl needed, seconds

Jobs (a registry of verl overrides, `JOBS`):
- `step`: the shape of tools/bench/bench_grpo_step.py. Random Qwen2.5-0.5B-shaped weights (transformers, saved as
  an HF dir), TRL's word-level tokenizer (tools/bench/bench_trl_grpo.py `word_tokenizer`) whose chat template is the
  bare text, so a prompt of 128 random words is 128 tokens. 64 prompts x 8, 256 new
  tokens, one optimizer step a step, no KL, random rewards (tools/bench/verl_hooks.py `random_score`).
- `gsm8k`: our preset configs/gsm8k_grpo_smollm2.yaml in verl's keys, with our reward (`preset_score`) and
  `--minutes` of training from the first step (`verl_hooks.install_deadline`; the start-up before it is reported
  apart: `startup_s`); verl saves an HF export at the end for the evaluator (tools/bench/eval_gsm8k_hf.py).

verl runs its FSDP backend with SGLang rollout, colocated (`rollout.mode=async`, the hybrid engine's sleep and wake),
tuned as its performance docs advise: token-budget micro-batches (`use_dynamic_bsz`; the step job at verl's default
16384 tokens per GPU, the real job at our preset's 65536), no parameter or optimizer offload,
`gpu_memory_utilization=0.5` (ours uses the same). Without a flash-attn wheel for the box, verl runs
`attn_implementation=sdpa` with `use_remove_padding=False`: its remove-padding packs a micro-batch into one row,
which sdpa does not isolate (tools/gpu/verl_research.md section 1). Ours packs; say so next to trainer figures.
Without flash-attn, verl's log-probs also fall back to a Python loop over tokens; `--logprobs batched` (the default)
runs the same maths in chunks, as verl would run with flash-attn's kernel (`verl_hooks.batched_logprobs`).

`run` writes OUT/verl_<job>.log, OUT/verl_<job>_steps.json (every step's console metrics) and, for `step`,
OUT/grpo_step_part_verl.json in bench_grpo_step's format (`--combine` puts it in the table with ours and TRL's).
The trainer MFU uses our FLOP count (rlhf_mcore.models.flops) on verl's phase times, the same formula as ours.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rlhf_mcore.models.flops import forward_flops_per_token
from tools.bench.verl_hooks import END_BY_ENV, LOGPROBS_CHOICES, LOGPROBS_ENV, MINUTES_ENV

PEAK_TFLOPS = 790.0  # the H200's measured bf16 dense rate, as bench_grpo_step.py
HOOKS = Path(__file__).with_name("verl_hooks.py")
REPO = HOOKS.parents[2]  # on verl's PYTHONPATH: its Ray workers import tools.bench.verl_hooks and rlhf_mcore
STEP_SHAPE = dict(prompts=64, n=8, prompt_len=128, new_tokens=256)
TINY_SHAPE = dict(prompts=4, n=2, prompt_len=12, new_tokens=8)
# verl's timing names -> bench_grpo_step's phase names (the same table columns)
PHASES = {"gen": "gen", "reward": "reward", "old_log_prob": "old_log_prob", "ref": "ref", "adv": "adv",
          "update_actor": "update_actor", "update_weights": "sync_weights", "step": "step"}


def common_overrides(model: str, workdir: str, tokenizer: str = "", gpus: int = 1) -> list[str]:
    """What every job shares: GRPO, FSDP + SGLang colocated on one node, sdpa without remove-padding. `tokenizer`:
    a tokenizer dir apart from the model's (verl's `model.tokenizer_path`)."""
    return [*([f"actor_rollout_ref.model.tokenizer_path={tokenizer}"] if tokenizer else []),
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.skip_tokenizer_init=True",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=flashinfer",
        # SGLang 0.5.17 compiles piecewise prefill graphs at start (over 3 minutes here); a start-up cost only
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.disable_prefill_cuda_graph=True",
        "data.return_raw_chat=True", "data.filter_overlong_prompts=True", "data.truncation=error",
        "trainer.critic_warmup=0", "trainer.logger=console", f"trainer.n_gpus_per_node={gpus}", "trainer.nnodes=1",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.resume_mode=disable",
        "trainer.total_epochs=1000", "trainer.project_name=bench", f"trainer.default_local_dir={workdir}/ckpt",
        f"hydra.run.dir={workdir}/hydra",
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tools.bench.verl_hooks.setup_worker",
    ]


def whole_batch(rows: int) -> list[str]:
    """The rollout batch decodes at once, as ours does: verl's `rollout.max_num_seqs` (SGLang's max_running_requests;
    verl's default 256 ran the 512-row step batch in two waves on 2026-12-04), and SGLang's decode CUDA graphs up to
    it, the setting our SGLang engine makes (`rollout.sglang_engine.engine_kwargs`; SGLang 0.5.17's default stops at
    256 rows and decodes more eagerly)."""
    return [f"actor_rollout_ref.rollout.max_num_seqs={rows}",
            f"+actor_rollout_ref.rollout.engine_kwargs.sglang.cuda_graph_max_bs_decode={rows}"]


STEP_MAX_TOKENS = 16384  # verl's default ppo_max_token_len_per_gpu. At 65536 (2026-12-04) the 152k-vocab logits
# of a micro-batch took verl's actor to 126.5 GiB allocated (136 reserved) of the H200's 140, and a step to 69 s
GSM8K_MAX_TOKENS = 65536  # our preset's actor.max_tokens_per_gpu (SmolLM2's vocabulary is 49k)


def token_budget(max_tokens: int) -> list[str]:
    """verl's token budget per micro-batch (`use_dynamic_bsz`), for the training and the log-prob passes."""
    return [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max_tokens}"]


def step_overrides(data: str, steps: int, shape: dict, max_tokens: int = 0) -> list[str]:
    """bench_grpo_step's shape: one optimizer step per step (mini-batch = all prompts), no KL, random rewards."""
    return [*token_budget(max_tokens or STEP_MAX_TOKENS),
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/train.parquet",
        f"data.train_batch_size={shape['prompts']}", f"data.max_prompt_length={shape['prompt_len']}",
        f"data.max_response_length={shape['new_tokens']}", f"actor_rollout_ref.rollout.n={shape['n']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={shape['prompts']}", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=False", *whole_batch(shape["prompts"] * shape["n"]),
        f"reward.custom_reward_function.path={HOOKS}", "reward.custom_reward_function.name=random_score",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}",
    ]


def gsm8k_overrides(data: str, steps: int, shape: dict, max_tokens: int = 0) -> list[str]:
    """configs/gsm8k_grpo_smollm2.yaml in verl's keys (k3 is verl's low_var_kl), our reward; an HF export at the
    end (`hf_model`) for the evaluator."""
    return [*token_budget(max_tokens or GSM8K_MAX_TOKENS),
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=64", "data.max_prompt_length=256", "data.max_response_length=256",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", *whole_batch(64 * 8),
        f"reward.custom_reward_function.path={HOOKS}", "reward.custom_reward_function.name=preset_score",
        "trainer.save_freq=100000", "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
        f"trainer.total_training_steps={steps}",
    ]


JOBS = {"step": step_overrides, "gsm8k": gsm8k_overrides}


def verl_command(job: str, model: str, data: str, workdir: str, steps: int, shape: dict | None = None,
                 tokenizer: str = "", python: str = sys.executable, max_tokens: int = 0) -> list[str]:
    """verl's command line for `job` (`max_tokens`: its token budget per micro-batch; 0: the job's)."""
    return [python, "-m", "verl.trainer.main_ppo", *common_overrides(model, workdir, tokenizer),
            *JOBS[job](data, steps, shape or STEP_SHAPE, max_tokens)]


STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - ")
# a value is a number, or numpy 2's repr of one (`np.float64(1.5)`: verl's logger pformats numpy scalars)
PAIR = re.compile(r"([\w/@.\-]+):(?:np\.[a-z0-9_]+\()?([-+0-9.eE]+|nan|inf)\)?(?= - |\s*$)")


def parse_console(lines) -> list[dict]:
    """verl's console logger lines (`step:N - key:value - ...`) -> one dict of floats per step, in order."""
    steps = []
    for line in lines:
        match = STEP_LINE.search(line)
        if match is None:
            continue
        pairs = PAIR.findall(line[match.start():])
        steps.append({"step": int(match.group(1)), **{k: float(v) for k, v in pairs if k != "step"}})
    return steps


def trainer_flops(hf: dict, rows: int, seq: float, passes: float) -> float:
    """FLOPs of `passes` forward-equivalents over `rows` sequences of mean length `seq` (bench_grpo_step's
    formula: the attention term at the mean context seq / 2)."""
    return passes * forward_flops_per_token(hf, seq / 2) * rows * seq


PEAK_MEM_KEY = "actor/perf/max_memory_allocated_gb"  # verl 0.9.1's name for the actor's peak


def summarize_step(steps: list[dict], hf: dict, shape: dict, warmup: int = 1) -> dict:
    """bench_grpo_step's result format from verl's per-step metrics (medians over the steps after `warmup`)."""
    timed = steps[warmup:] or steps
    med = {ours: statistics.median(s.get(f"timing_s/{name}", 0.0) for s in timed) for name, ours in PHASES.items()}
    rows = shape["prompts"] * shape["n"]
    prompt = statistics.median(s.get("prompt_length/mean", shape["prompt_len"]) for s in timed)
    response = statistics.median(s.get("response_length/mean", shape["new_tokens"]) for s in timed)
    seq = prompt + response
    passes = (1.0 if med["old_log_prob"] else 0.0) + (1.0 if med["ref"] else 0.0) + 3.0
    train_s = med["old_log_prob"] + med["ref"] + med["update_actor"]
    peak = PEAK_TFLOPS * 1e12
    return {
        "step_s": med["step"], "steps_s": [s.get("timing_s/step") for s in timed],
        "phases_s": {k: v for k, v in med.items() if k != "step"},
        "tokens_per_s": rows * seq / med["step"],
        "rollout_tokens_per_s": rows * response / med["gen"] if med["gen"] else None,
        "logprob_update_mfu": trainer_flops(hf, rows, seq, passes) / max(train_s, 1e-9) / peak,
        "update_mfu": trainer_flops(hf, rows, seq, 3.0) / max(med["update_actor"], 1e-9) / peak,
        "verl_reported_mfu": statistics.median(s.get("perf/mfu/actor", 0.0) for s in timed),
        "mean_prompt_len": prompt, "mean_response_len": response,
        "peak_mem_gib": max((s.get(PEAK_MEM_KEY, 0.0) for s in timed), default=None),
        "timed_steps": len(timed),
    }


def prepare_step(directory: str, tiny: bool, shape: dict, steps: int = 8) -> None:
    """The step job's DIR/hf (random Qwen2.5-0.5B shape), DIR/tokenizer (words, bare chat template) and
    DIR/data/train.parquet."""
    import torch

    from rlhf_mcore.data import make_row, write_prompt_parquet
    from tools.bench.bench_trl_grpo import qwen_model, word_tokenizer

    out = Path(directory)
    model, vocab = qwen_model(tiny, torch.float32 if tiny else torch.bfloat16)
    model.save_pretrained(out / "hf")
    # a dir of its own: next to a Qwen2 config.json, AutoTokenizer (transformers 5) rebuilds it as Qwen2's BPE
    word_tokenizer(vocab).save_pretrained(out / "tokenizer")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (shape["prompts"] * steps, shape["prompt_len"]), generator=g).tolist()
    rows = (make_row("random", " ".join(f"t{i}" for i in row), "random", "0", {"index": k})
            for k, row in enumerate(ids))
    write_prompt_parquet(rows, out / "data" / "train.parquet")


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # verl, Ray and SGLang's processes: one session
    except ProcessLookupError:  # it ended just before
        pass


READY = "ready to fit"  # verl's TaskRunner, once Ray, the FSDP engines and SGLang are up


def run_verl(cmd: list[str], log_path: Path, timeout_s: float, env: dict) -> tuple[int, float | None]:
    """verl's main_ppo with its output in `log_path` (step lines echoed); the exit code (-9: killed at `timeout_s`,
    silent or not) and the seconds from launch to READY (None if never)."""
    ready = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        watchdog = threading.Timer(timeout_s, kill_group, (proc.pid,))
        watchdog.start()
        start = time.monotonic()
        for line in proc.stdout:
            log.write(line)
            if ready is None and READY in line:
                ready = time.monotonic() - start
            if STEP_LINE.search(line) or READY in line or "Traceback" in line or "Error" in line[:200]:
                print(f"[{time.monotonic() - start:6.0f}s] {line.rstrip()[:240]}", flush=True)
        watchdog.cancel()
        return proc.wait(), ready


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or f"{args.dir}/hf"
    data = args.data or f"{args.dir}/data"
    workdir = args.workdir or tempfile.mkdtemp(prefix=f"verl_{args.job}_")
    steps = args.steps if args.job == "step" else 100000
    tokenizer = args.tokenizer or (f"{args.dir}/tokenizer" if args.job == "step" else "")
    cmd = verl_command(args.job, model, data, workdir, steps, tokenizer=tokenizer, max_tokens=args.max_tokens)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get(
        "PYTHONPATH", "")])), RAY_USAGE_STATS_ENABLED="0", RAY_memory_monitor_refresh_ms="0",
        **{LOGPROBS_ENV: args.logprobs})
    if args.minutes:
        env[MINUTES_ENV] = str(args.minutes)
        if args.end_margin:  # the last step, the checkpoint and its export inside the watchdog
            env[END_BY_ENV] = str(time.time() + args.timeout - args.end_margin)
    (out / f"verl_{args.job}_cmd.txt").write_text(" \\\n  ".join(cmd) + "\n")
    start = time.time()
    rc, startup = run_verl(cmd, out / f"verl_{args.job}.log", args.timeout, env)
    wall = time.time() - start
    steps_seen = parse_console(open(out / f"verl_{args.job}.log", errors="replace"))
    (out / f"verl_{args.job}_steps.json").write_text(json.dumps(steps_seen, indent=1))
    print(f"verl {args.job}: rc {rc}, {len(steps_seen)} steps in {wall:.0f} s")
    found = versions()
    result = {"system": f"verl-{found['verl']}", "engine": "sglang", "rc": rc, "wall_s": wall, "startup_s": startup,
              "steps": len(steps_seen), "logprobs": args.logprobs, "versions": found}
    if args.job == "step" and steps_seen:
        hf = json.loads(Path(model, "config.json").read_text())
        result.update(summarize_step(steps_seen, hf, STEP_SHAPE), shape=STEP_SHAPE)
        (out / "grpo_step_part_verl.json").write_text(json.dumps(result, indent=2))
    else:
        ckpts = sorted(Path(workdir, "ckpt").glob("global_step_*/actor/huggingface"),
                       key=lambda p: int(p.parent.parent.name.split("_")[-1]))
        result["hf_export"] = str(ckpts[-1]) if ckpts else None
        (out / f"verl_{args.job}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("steps_s", "versions")}, default=str))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("verl", "sglang", "torch", "transformers", "ray"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def job_summary(steps: list[dict], rows_per_step: int, warmup: int = 1) -> dict:
    """One system's real-job figures from its per-step metrics (verl's console lines and our metrics.jsonl use the
    same names): training steps and seconds, the median step after `warmup` (over all steps, and over the first five
    of them: both systems still answer at the start model's lengths there), samples and tokens a second, and the
    mean train score of the first and last five steps."""
    train = [s for s in steps if "timing_s/step" in s]
    if not train:
        return {"steps": 0}
    seconds = sum(s["timing_s/step"] for s in train)
    scores = [s["critic/score/mean"] for s in train if "critic/score/mean" in s]
    tokens = sum(s.get("perf/total_num_tokens", 0.0) for s in train)
    return {"steps": len(train), "train_s": seconds,
            "step_s": statistics.median(s["timing_s/step"] for s in (train[warmup:] or train)),
            "step_s_first5": statistics.median(s["timing_s/step"] for s in (train[warmup:warmup + 5] or train)),
            "samples_per_s": rows_per_step * len(train) / seconds, "tokens_per_s": tokens / seconds if tokens else None,
            "score_first5": statistics.mean(scores[:5]) if scores else None,
            "score_last5": statistics.mean(scores[-5:]) if scores else None}


def train_minutes(verl_steps: list[dict], minutes: float) -> float:
    """How long ours trains on the real job: `minutes`, or verl's training time if its deadline cut it shorter
    (its steps' seconds), so both train equally long.

    >>> train_minutes([{"timing_s/step": 30.0}] * 6, 5.0), train_minutes([{"timing_s/step": 60.0}] * 6, 5.0)
    (3.0, 5.0)
    """
    seconds = sum(s.get("timing_s/step", 0.0) for s in verl_steps)
    return min(minutes, seconds / 60) if seconds else minutes


def compare_jobs(directory: str, rows_per_step: int = 64 * 8) -> dict:
    """The real job, verl against ours, from gpu_verl.sh's files in `directory` (verl_gsm8k.json and _steps.json,
    ours_gsm8k_metrics.jsonl, and every eval_gsm8k*.json, merged in name order: one lease may evaluate verl's export
    alone) with each system's `job_summary`, start-up and greedy accuracy; ours over verl's samples a second, and
    verl's step over ours, in all and over the first five steps; written to directory/vs_verl_gsm8k.json."""
    d = Path(directory)
    read = lambda name: json.loads((d / name).read_text()) if (d / name).exists() else {}  # noqa: E731
    ours_steps = [json.loads(line) for line in open(d / "ours_gsm8k_metrics.jsonl")] \
        if (d / "ours_gsm8k_metrics.jsonl").exists() else []
    systems = {"verl": {**job_summary(read("verl_gsm8k_steps.json") or [], rows_per_step),
                        "startup_s": read("verl_gsm8k.json").get("startup_s")},
               "ours": job_summary(ours_steps, rows_per_step)}
    evals = {}
    for path in sorted(d.glob("eval_gsm8k*.json")):
        evals.update(json.loads(path.read_text()).get("models", {}))
    for name, row in systems.items():
        row.update({k: evals.get(name, {}).get(k) for k in ("acc", "se", "format")})
    ratio = lambda key, a, b: systems[a][key] / systems[b][key] \
        if systems[a].get(key) and systems[b].get(key) else None  # noqa: E731
    out = {"systems": systems, "start_model": evals.get("start"),
           "ratio_samples_per_s": ratio("samples_per_s", "ours", "verl"),
           "ratio_step_s": ratio("step_s", "verl", "ours"),
           "ratio_step_s_first5": ratio("step_s_first5", "verl", "ours")}
    (d / "vs_verl_gsm8k.json").write_text(json.dumps(out, indent=2))
    return out


def dry_run() -> None:
    """CPU: prepare the tiny step job, build both commands, parse a console line in verl's format."""
    work = Path(tempfile.mkdtemp(prefix="verl_dry_"))
    prepare_step(str(work), tiny=True, shape=TINY_SHAPE, steps=2)
    for job in JOBS:
        print(" ".join(verl_command(job, str(work / "hf"), str(work / "data"), str(work), 2, TINY_SHAPE,
                                    tokenizer=str(work / "tokenizer"))))
    line = ("step:2 - timing_s/gen:1.5 - timing_s/old_log_prob:0.25 - timing_s/update_actor:0.75 - "
            "timing_s/update_weights:0.1 - timing_s/step:2.75 - response_length/mean:8.0 - prompt_length/mean:12.0")
    hf = json.loads((work / "hf" / "config.json").read_text())
    print(json.dumps(summarize_step(parse_console([line]), hf, TINY_SHAPE, warmup=0)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["prepare", "run", "compare"],
                   help="compare: the real job's files in --out, verl against ours (vs_verl_gsm8k.json)")
    p.add_argument("--dry-run", action="store_true", help="CPU check of everything but verl itself")
    p.add_argument("--job", default="step", choices=sorted(JOBS))
    p.add_argument("--dir", default="/tmp/verl_step", help="prepare's output (the step job's hf/ and data/)")
    p.add_argument("--model", default="", help="HF model dir (default: DIR/hf)")
    p.add_argument("--data", default="", help="dir of train.parquet / test.parquet (default: DIR/data)")
    p.add_argument("--tokenizer", default="", help="tokenizer dir (default: DIR/tokenizer for the step job, "
                   "else the model's)")
    p.add_argument("--workdir", default="", help="verl's checkpoints and Hydra output (default: a temp dir)")
    p.add_argument("--steps", type=int, default=4, help="step job: verl steps (the first warms up)")
    p.add_argument("--max-tokens", type=int, default=0, help="verl's token budget per micro-batch (default: "
                   f"the job's: step {STEP_MAX_TOKENS}, gsm8k {GSM8K_MAX_TOKENS})")
    p.add_argument("--minutes", type=float, default=0.0, help="gsm8k job: minutes of training from the first step")
    p.add_argument("--timeout", type=float, default=540.0, help="kill verl after this many seconds")
    p.add_argument("--end-margin", type=float, default=90.0, help="gsm8k job: end training this many seconds "
                   "before --timeout (0: only --minutes ends it)")
    p.add_argument("--logprobs", default=LOGPROBS_CHOICES[0], choices=LOGPROBS_CHOICES,
                   help="verl's log-prob fallback without flash-attn: batched (verl_hooks.batched_logprobs, as "
                        "with flash-attn's kernel) or loop (verl's own, one row at a time: leases 2-6)")
    p.add_argument("--out", default="results")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run()
    if args.action == "prepare":
        return prepare_step(args.dir, tiny=False, shape=STEP_SHAPE)
    if args.action == "compare":
        return print(json.dumps(compare_jobs(args.out), indent=2))
    if args.action == "run":
        return run(args)
    raise SystemExit("say prepare, run or --dry-run")


if __name__ == "__main__":
    main()
