#!/usr/bin/env bash
# Issue 23, multi-turn tool calling on one H200: part B only (call B of the session, after the shared SmolLM2 /
# GSM8K preparation: $SMOL/hf, $SMOL/mcore, $SMOL/gsm8k/{train,test}.parquet, SMOL=/tmp/small_speed).
#   bash tools/gpu/gpu_multi_turn.sh B        # at most 300 s in all (each command under `timeout`)
# 1. configs/gsm8k_tool_grpo_smollm2.yaml (calculator tool, hermes, up to 4 turns) for ~130 s of training
#    (trainer.time_limit_min counts the start-up too): per step the tool calls per sample, turns, reward,
#    accuracy, tool error rate, the rollout/trainer log-prob mismatch over policy tokens, phase seconds.
# 2. if time is left, 2 steps each, for the step time of a multi-turn step vs a single-turn step per token:
#    "forced": the same preset with forced tool calls (tools/bench/multi_turn_forced.py: every turn ends at a
#    newline and is one calculator call, so samples take up to 4 turns; SmolLM2-135M writes no <tool_call> of
#    its own), then "single": rollout.mode=single_turn (no tool schema in the prompt, one generate call).
# Writes $OUT/multi_turn/{multi,forced,single}.log and .metrics.jsonl, summary.json (curves and means) and
# prints the table. CPU dry run (tiny SMOL from the local GGUF, tiny sizes):
#   DRY=1 OUT=/tmp/dry_multi_turn PY=.venv/bin/python bash tools/gpu/gpu_multi_turn.sh B
set -uo pipefail
PART=${1:?B}
[[ $PART == B ]] || { echo "gpu_multi_turn.sh: only part B (got $PART)"; exit 0; }
PY=${PY:-python3}
SMOL=${SMOL:-/tmp/small_speed}
BUDGET=${BUDGET:-300}  # seconds for the whole script
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
D=$OUT/multi_turn
mkdir -p "$D"
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { echo $(( BUDGET - SECONDS - ${1:-0} )); }

if [[ -n "${DRY:-}" ]]; then
  SMOL=${DRY_SMOL:-/tmp/dry_smol_multi_turn}
  source tools/gpu/dry_smol.sh && dry_smol $SMOL  # a tiny SMOL: the real tokenizer and weights, 64 train rows
  EXTRA=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=24
         rollout.multi_turn.max_turns=2 actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4
         reward.num_workers=1 rollout.multi_turn.workers=2)
  LIMIT_MIN=0.05; MULTI_TIMEOUT=400; SINGLE_STEPS=1; BUDGET=900; SECONDS=0  # CPU: slower, not timed
else
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: megatron-core is not in /tmp/site (call A installs it)"; exit 9; }
  EXTRA=()
  LIMIT_MIN=${LIMIT_MIN:-2.6}; MULTI_TIMEOUT=${MULTI_TIMEOUT:-215}; SINGLE_STEPS=2
fi
for f in $SMOL/hf/config.json $SMOL/mcore $SMOL/gsm8k/train.parquet $SMOL/gsm8k/test.parquet; do
  [[ -e $f ]] || { echo "missing $f: call B prepares SmolLM2 and GSM8K under \$SMOL first (gpu_small_speed.sh)"; exit 4; }
done
COMMON=(model.hf_path=$SMOL/hf model.load=$SMOL/mcore data.train_files=$SMOL/gsm8k/train.parquet
        data.val_files=$SMOL/gsm8k/test.parquet trainer.test_freq=0 trainer.save_freq=0 trainer.export_hf=false
        trainer.resume=disable "trainer.logger=[console,jsonl]")

train() {  # name seconds module overrides...
  local name=$1 secs=$2 module=$3; shift 3
  rm -rf /tmp/mt_run_$name
  log "$name: $module ${*:-(preset)} (timeout ${secs}s)"
  timeout -k 5 "$secs" $PY -m $module --config configs/gsm8k_tool_grpo_smollm2.yaml "${COMMON[@]}" \
      trainer.output_dir=/tmp/mt_run_$name "${EXTRA[@]}" "$@" 2>&1 | grep -v "Warning\|warnings.warn" > $D/$name.log
  echo "$name rc ${PIPESTATUS[0]}"
  cp /tmp/mt_run_$name/metrics.jsonl $D/$name.metrics.jsonl 2>/dev/null
  grep "rollout: \|step [0-9]*/\|Traceback\|Error" $D/$name.log | cut -c1-400 | tail -14
}

train multi $(( $(left 20) < MULTI_TIMEOUT ? $(left 20) : MULTI_TIMEOUT )) rlhf_mcore.train \
    trainer.time_limit_min=$LIMIT_MIN trainer.total_steps=1000
for name in forced single; do
  REST=$(left 8)
  if (( REST < 50 )) && [[ -z "${DRY:-}" ]]; then echo "$name: skipped (${REST}s left)"; continue; fi
  if [[ $name == forced ]]; then
    train forced $(( REST < 100 ? REST : 100 )) tools.bench.multi_turn_forced trainer.total_steps=$SINGLE_STEPS
  else
    train single $REST rlhf_mcore.train rollout.mode=single_turn trainer.total_steps=$SINGLE_STEPS
  fi
done
RUNS=(--run multi=/tmp/mt_run_multi)
for name in forced single; do
  [[ -f /tmp/mt_run_$name/metrics.jsonl ]] && RUNS+=(--run $name=/tmp/mt_run_$name)
done
log "summary"
timeout 20 $PY -m tools.bench.multi_turn_summary "${RUNS[@]}" --out $D/summary.json | tee $D/summary.txt
log "done"
