#!/usr/bin/env bash
# Issue 25, LoRA on one H200, two parts (one per call of the session, same warm machine):
#   bash tools/gpu/gpu_lora.sh A   # <= 170 s: tools/bench/bench_lora_step.py, a Qwen2.5-7B shape (random
#                                  # weights, bf16) with rank-32 all-linear LoRA: GRPO-like step (old log-prob
#                                  # forward + update fwd/bwd + optimizer step, 32 x 1024 tokens) time, peak
#                                  # memory, MFU; vs full fine-tuning of the same shape cut to the layers that fit
#   bash tools/gpu/gpu_lora.sh C   # <= 300 s, one self-sufficient call (carry .gpu-speed-w1/mcore: it installs
#                                  # megatron-core): LoRA on MoE experts: the MoE GPU tests (grouped_mm + LoRA vs
#                                  # the fp32 loop), then bench_moe_step at the Qwen3-30B-A3B shape cut to 4 layers,
#                                  # full fine-tuning against rank 32 on every linear (experts too): step s, peak
#   bash tools/gpu/gpu_lora.sh B   # <= 170 s, after call B's SmolLM2 / GSM8K preparation ($SMOL/hf, $SMOL/mcore,
#                                  # $SMOL/gsm8k/{train,test}.parquet, SMOL=/tmp/small_speed):
#                                  # configs/gsm8k_grpo_lora_smollm2.yaml for ~130 s (trainer.time_limit_min counts
#                                  # the start-up too): reward / accuracy / format rate and step seconds per step
# Writes $OUT/lora/ (A: lora_step.json, bench.log; B: train.log, metrics.jsonl, summary.json) and prints the tables.
# CPU dry runs (tiny sizes, local venv):
#   DRY=1 OUT=/tmp/dry_lora PY=.venv/bin/python bash tools/gpu/gpu_lora.sh A
#   DRY=1 OUT=/tmp/dry_lora PY=.venv/bin/python bash tools/gpu/gpu_lora.sh B
set -uo pipefail
PART=${1:?A|B|C}
PY=${PY:-python3}
SMOL=${SMOL:-/tmp/small_speed}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
D=$OUT/lora
mkdir -p "$D"
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
if [[ -z "${DRY:-}" && $PART == C && ! -d /tmp/site/megatron ]]; then
  source tools/gpu/gpu_env.sh
  mkdir -p /tmp/site && install .gpu-speed-w1/mcore/megatron_core*.whl || exit 3
fi
if [[ -z "${DRY:-}" ]]; then
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: megatron-core is not in /tmp/site (call A installs it)"; exit 9; }
fi

if [[ $PART == C ]]; then
  log "MoE GPU tests (LoRA on the grouped experts among them)"
  timeout -k 5 100 $PY -m pytest -q -p no:cacheprovider tests/unit/models/test_moe_gpu.py -s 2>&1 \
      | grep "rel err\|passed\|failed\|Error\|skipped" | tail -8
  if [[ -n "${DRY:-}" ]]; then ARGS=(--tiny); else ARGS=(--moe-layers ${LAYERS:-4} --sequences 8 --steps 2); fi
  for rank in 0 32; do
    log "bench_moe_step, LoRA rank $rank (0: full fine-tuning)"
    timeout -k 5 ${BENCH_S:-100} $PY -m tools.bench.bench_moe_step --find-largest 0 --dense 0 --lora-rank $rank \
        --out $D "${ARGS[@]}" 2>&1 | grep -v "Warning\|warnings.warn\|return func" > $D/moe_lora$rank.log
    echo "rc ${PIPESTATUS[0]}"
    sed -n '/tokens per step/,/log-probs/p' $D/moe_lora$rank.log | cut -c1-200
    grep -q "tokens per step" $D/moe_lora$rank.log || tail -8 $D/moe_lora$rank.log
  done
  log "done"
  exit 0
fi

if [[ $PART == A ]]; then
  log "bench_lora_step"
  if [[ -n "${DRY:-}" ]]; then ARGS=(--tiny); else ARGS=(--budget-s 140); fi
  timeout -k 5 160 $PY -m tools.bench.bench_lora_step --out $D "${ARGS[@]}" 2>&1 \
      | grep -v "Warning\|warnings.warn\|return func\|if hasattr(param" > $D/bench.log
  echo "rc ${PIPESTATUS[0]}"
  sed -n '/tokens per step/,$p' $D/bench.log
  grep -q "tokens per step" $D/bench.log || tail -20 $D/bench.log
  log "done"
  exit 0
fi
[[ $PART == B ]] || { echo "gpu_lora.sh: part A, B or C (got $PART)"; exit 2; }

if [[ -n "${DRY:-}" ]]; then
  SMOL=${DRY_SMOL:-/tmp/dry_smol_lora}
  source tools/gpu/dry_smol.sh && dry_smol $SMOL  # a tiny SMOL: the real tokenizer and weights, 64 train rows
  EXTRA=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=8
         actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 reward.num_workers=1 trainer.total_steps=2)
  LIMIT_MIN=0; TRAIN_TIMEOUT=600
else
  EXTRA=(trainer.total_steps=1000)
  LIMIT_MIN=${LIMIT_MIN:-2.15}; TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-158}
fi
for f in $SMOL/hf/config.json $SMOL/mcore $SMOL/gsm8k/train.parquet $SMOL/gsm8k/test.parquet; do
  [[ -e $f ]] || { echo "missing $f: call B prepares SmolLM2 and GSM8K under \$SMOL first (gpu_small_speed.sh)"; exit 4; }
done
RUN=/tmp/lora_run_b
rm -rf $RUN
log "configs/gsm8k_grpo_lora_smollm2.yaml (timeout ${TRAIN_TIMEOUT}s, trainer.time_limit_min=$LIMIT_MIN)"
timeout -k 5 $TRAIN_TIMEOUT $PY -m rlhf_mcore.train --config configs/gsm8k_grpo_lora_smollm2.yaml \
    model.hf_path=$SMOL/hf model.load=$SMOL/mcore data.train_files=$SMOL/gsm8k/train.parquet \
    data.val_files=$SMOL/gsm8k/test.parquet trainer.output_dir=$RUN trainer.time_limit_min=$LIMIT_MIN \
    trainer.test_freq=0 trainer.save_freq=0 trainer.export_hf=false trainer.resume=disable \
    "trainer.logger=[console,jsonl]" "${EXTRA[@]}" 2>&1 | grep -v "Warning\|warnings.warn" > $D/train.log
echo "train rc ${PIPESTATUS[0]}"
grep "lora\|LoRA\|Traceback\|Error" $D/train.log | cut -c1-300 | head -8
cp $RUN/metrics.jsonl $D/metrics.jsonl 2>/dev/null
timeout 20 $PY - "$D" <<'PY'
import json, sys
d = sys.argv[1]
try:
    rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
except OSError:
    sys.exit("no metrics.jsonl (the run did not finish a step)")
rows = [r for r in rows if "critic/score/mean" in r]
keys = {"reward": "critic/score/mean", "acc": "critic/acc/mean", "format": "critic/format/mean",
        "step_s": "timing_s/step", "kl": "actor/kl", "len": "response_length/mean"}
print(f"{'step':>5}" + "".join(f"{k:>9}" for k in keys))
for r in rows:
    print(f"{r.get('step', '-'):>5}" + "".join(f"{r.get(v, float('nan')):>9.3f}" for v in keys.values()))
curve = {k: [r.get(v) for r in rows] for k, v in keys.items()}
tail = rows[-3:]
summary = {"config": "configs/gsm8k_grpo_lora_smollm2.yaml", "steps": len(rows), "curves": curve,
           "last3_mean": {k: sum(r.get(v, 0.0) for r in tail) / max(len(tail), 1) for k, v in keys.items()}}
json.dump(summary, open(f"{d}/summary.json", "w"), indent=2)
print("last 3 steps mean:", {k: round(v, 3) for k, v in summary["last3_mean"].items()})
PY
log "done"
