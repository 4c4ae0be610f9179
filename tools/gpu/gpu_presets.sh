#!/usr/bin/env bash
# Issue 38 on one warm H200: the real SmolLM2-135M-Instruct / GSM8K presets for MINUTES each (start-up included),
# greedy validation on all 1319 test prompts before and after, run side by side on the one GPU (a 135M step is
# launch-bound: the GPU is shared, and each run's steps per minute say what it got). Two calls on the same machine
# (a call carries at most 64 MiB and the GGUF is 98 MB, split in halves under gguf/):
#   bash tools/gpu/gpu_presets.sh part1   # carry .gpu-async-w (megatron-core cp312, gguf) and gguf/smollm2.gguf.part1
#   bash tools/gpu/gpu_presets.sh part2   # carry gguf/smollm2.gguf.part2: SmolLM2 + GSM8K, then every run of RUNS
#                                         # side by side, and the start model's pass@k (PASSK=16; 0: none)
# RUNS: "name:config:a.b=1,c.d=2;name2:config2:" (default: the five presets). Per run: <name>.log,
# <name>_metrics.jsonl, <name>_val/ (every validation sample: the per-problem curve), packed in $OUT/runs.tgz. Then
# tools/bench/learning_summary.py: $OUT/learning.json and $OUT/summary.md.
# Longer than one call (10 minutes): SAVE=1 MINUTES=8 part2, then RESUME=1 VAL_BEFORE=false MINUTES=... part2 with
# the same RUNS on the same warm machine: each run resumes its checkpoint (metrics.jsonl goes on), validates at the end.
# VAL_BEFORE=false: no validation before training (runs that share one start model: part2's gives the "before").
# BUDGET: actor.max_tokens_per_gpu for each run (16384: side by side, the presets' 65536 would peak near 40 GB each;
# micro-batching does not change the metrics).
# CPU dry run (tiny sizes, the local venv, a few seconds per step):
#   DRY=1 OUT=/tmp/dry_presets PY=.venv/bin/python bash tools/gpu/gpu_presets.sh part2
set -uo pipefail
PART=${1:?part1|part2}
PY=${PY:-python3}
MINUTES=${MINUTES:-5}
PASSK=${PASSK:-16}
BUDGET=${BUDGET:-16384}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 OMP_NUM_THREADS=2
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }

source tools/gpu/smol.sh
if [[ $PART == part1 ]]; then
  smol_part1 .gpu-async-w
  exit 0
fi

mkdir -p "$OUT"
W=/tmp/presets_w
PRESETS="grpo:gsm8k_grpo_smollm2.yaml:;ppo:gsm8k_ppo_smollm2.yaml:;dapo:gsm8k_dapo_smollm2.yaml:;"
PRESETS+="lora:gsm8k_grpo_lora_smollm2.yaml:;tool:gsm8k_tool_grpo_smollm2.yaml:"
IFS=';' read -r -a RUN_LIST <<< "${RUNS:-$PRESETS}"
if [[ -n "${DRY:-}" ]]; then
  W=/tmp/dry_presets_w
  source tools/gpu/dry_smol.sh && dry_smol $W/smol
  MODEL=$W/smol
  EXTRA=(model.dtype=fp32 data.train_batch_size=4 rollout.n=2 rollout.max_response_length=16
         actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 reward.num_workers=1 data.max_prompt_length=512
         reward.overlong_buffer=4 algorithm.filter_groups.enable=false)
  EVAL_EXTRA=(model.dtype=fp32 reward.num_workers=1)
  MINUTES=0.2
  [[ $PASSK -gt 0 ]] && PASSK=2
else
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part1 first"; exit 9; }
  MODEL=$W
  smol_prepare $W /tmp/smollm2.gguf
  EXTRA=(data.val_batch_size=256)
  EVAL_EXTRA=(data.val_batch_size=${PASSK_BATCH:-64})
fi
SAVE_FREQ=0 RESUME_MODE=disable
[[ -z "${SAVE:-}${RESUME:-}" ]] || SAVE_FREQ=-1  # a checkpoint at the end, for a later call to resume
[[ -z "${RESUME:-}" ]] || RESUME_MODE=auto
COMMON=(model.hf_path=$MODEL/hf model.load=$MODEL/mcore data.train_files=$MODEL/gsm8k/train.parquet
        data.val_files=$MODEL/gsm8k/test.parquet trainer.save_freq=$SAVE_FREQ trainer.export_hf=false
        trainer.resume=$RESUME_MODE "trainer.logger=[console,jsonl]")
port=29610
names=() pids=()
for run in "${RUN_LIST[@]}"; do
  IFS=: read -r name config sets <<< "$run"
  IFS=, read -r -a overrides <<< "$sets"
  names+=("$name")
  [[ -n "${RESUME:-}" ]] || rm -rf $W/run_$name  # RESUME=1: the same runs go on from their last checkpoint
  log "$name: configs/$config ${overrides[*]}"
  MASTER_PORT=$port timeout -k 10 ${RUN_TIMEOUT:-480} $PY -m rlhf_mcore.train --config configs/$config "${COMMON[@]}" trainer.output_dir=$W/run_$name \
      trainer.val_before_train=${VAL_BEFORE:-true} trainer.time_limit_min=$MINUTES trainer.total_steps=1000 trainer.test_freq=100000 \
      trainer.validation_data_dir=$W/run_$name/val actor.max_tokens_per_gpu=$BUDGET "${EXTRA[@]}" \
      "${overrides[@]}" 2>&1 | grep -v "Warning\|warnings.warn" > $OUT/$name.log &
  pids+=($!) port=$((port + 1))
done
if [[ $PASSK -gt 0 ]]; then  # the start model's pass@k: greedy accuracy is not what it can reach
  log "start model: best@$PASSK at temperature 1.0 on every test prompt"
  MASTER_PORT=$port timeout -k 10 ${RUN_TIMEOUT:-480} $PY -m rlhf_mcore.evaluate --config configs/gsm8k_grpo_smollm2.yaml \
      --checkpoint $MODEL/hf --out $W/passk "${COMMON[@]:2}" rollout.val_n=$PASSK rollout.val_temperature=1.0 \
      rollout.val_do_sample=true "${EVAL_EXTRA[@]}" 2>&1 | grep -v "Warning\|warnings.warn" > $OUT/passk.log &
  pids+=($!)
fi
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 2 > $OUT/gpu.csv 2>/dev/null &
SMI=$!
wait "${pids[@]}"
kill $SMI 2>/dev/null
log "all runs ended"
for name in "${names[@]}"; do
  cp $W/run_$name/metrics.jsonl $OUT/${name}_metrics.jsonl 2>/dev/null
  mkdir -p $OUT/${name}_val && cp $W/run_$name/val/*.jsonl $OUT/${name}_val/ 2>/dev/null
  echo "--- $name"; grep "step [0-9]*/\|validation @\|Traceback\|Error" $OUT/$name.log | cut -c1-300 | tail -3
done
[[ $PASSK -gt 0 ]] && { cp $W/passk/eval.json $OUT/passk_eval.json 2>/dev/null; grep "best@\|Error" $OUT/passk.log | tail -3; }
passk=(); [[ $PASSK -gt 0 ]] && passk=(--passk $W/passk/generations)
$PY -m tools.bench.learning_summary --out $OUT --runs "${names[@]}" "${passk[@]}" | tee $OUT/summary.md
(cd $OUT && tar czf runs.tgz --remove-files *.log *_metrics.jsonl *_val gpu.csv 2>/dev/null)  # few files come back
