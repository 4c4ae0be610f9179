#!/usr/bin/env bash
# Issues 23, 24, 25 and 27 on one warm H200, in two calls (each under the box's 600 s per call):
#   WHL=.gpu-w/mcore bash tools/gpu/gpu_open_issues.sh A   # carry .gpu-w and gguf/smollm2.gguf.part1
#   bash tools/gpu/gpu_open_issues.sh B                    # carry gguf/smollm2.gguf.part2, on the same machine
# A (random weights, <= ~470 s): megatron-core into /tmp/site; GPU tests of the new code; the GRPO step at the
#   Qwen2.5-0.5B shape with token-budget micro-batches (issue 27: trainer-phase MFU); gpu_moe.sh A (issue 24);
#   gpu_lora.sh A (issue 25: the 7B shape).
# B (the real SmolLM2-135M-Instruct / GSM8K job, <= ~560 s): gpu_small_speed.sh part2 prepares $SMOL and runs the
#   preset with model.sdpa_kernel=flash for 4 steps (issue 27's A/B); the single-turn preset for ~1.8 min with a
#   profiled step (issue 27 after; the same-minutes baseline of 23 and 25); gpu_multi_turn.sh B; gpu_lora.sh B.
# Everything under $OUT/<feature>/.
set -uo pipefail
PART=${1:?A|B}
PY=${PY:-python3}
export SMOL=${SMOL:-/tmp/small_speed}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }

if [[ $PART == A ]]; then
  WHL=${WHL:?wheel folder} bash tools/gpu/gpu_small_speed.sh part1 || exit $?
  mkdir -p $OUT/tests $OUT/grpo_step
  log "GPU tests"
  timeout -k 5 100 $PY -m pytest -q -m gpu -p no:cacheprovider tests/unit/trainer/test_apex_free.py \
      tests/unit/models/test_build.py tests/unit/rollout/test_lora_decode.py -s 2>&1 \
      | grep -v "Warning\|warnings.warn" > $OUT/tests/gpu_tests.log
  grep "LORA_GPU\|passed\|failed\|FAILED\|Error" $OUT/tests/gpu_tests.log | cut -c1-300 | tail -12
  log "GRPO step, Qwen2.5-0.5B shape, token-budget micro-batches"
  timeout -k 5 110 $PY -m tools.bench.bench_grpo_step --engine native --prompt-len 192 --new-tokens 224 \
      --max-tokens 65536 --standalone 0 --steps 2 --label budget64k --out $OUT/grpo_step 2>&1 \
      | grep -v "Warning\|warnings.warn" > $OUT/grpo_step/bench.log
  tail -4 $OUT/grpo_step/bench.log
  log "MoE"
  BUDGET=150 bash tools/gpu/gpu_moe.sh A 2>&1 | tail -25
  log "LoRA A"
  bash tools/gpu/gpu_lora.sh A 2>&1 | tail -25
  log "done"
  exit 0
fi

[[ $PART == B ]] || { echo "part A or B (got $PART)"; exit 2; }
[[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part A first"; exit 9; }
log "SmolLM2: prepare, then the preset with model.sdpa_kernel=flash (4 steps, step 4 profiled)"
STEPS=4 timeout -k 5 110 bash tools/gpu/gpu_small_speed.sh part2 "flash:model.sdpa_kernel=flash" 2>&1 | tail -14
log "single-turn preset, ~1.8 min (step 5 profiled)"
mkdir -p $OUT/single
rm -rf /tmp/single_run
timeout -k 5 125 $PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.hf_path=$SMOL/hf \
    model.load=$SMOL/mcore data.train_files=$SMOL/gsm8k/train.parquet data.val_files=$SMOL/gsm8k/test.parquet \
    trainer.output_dir=/tmp/single_run trainer.time_limit_min=1.8 trainer.total_steps=1000 \
    "trainer.profile_steps=[5]" trainer.test_freq=0 trainer.save_freq=0 trainer.export_hf=false \
    trainer.resume=disable "trainer.logger=[console,jsonl]" 2>&1 | grep -v "Warning\|warnings.warn" > $OUT/single/train.log
echo "single rc ${PIPESTATUS[0]}"
cp -r /tmp/single_run/metrics.jsonl /tmp/single_run/profile $OUT/single/ 2>/dev/null
grep "step [0-9]*/" $OUT/single/train.log | tail -3 | cut -c1-400
sed -n '/profile step/,/written to/p' $OUT/single/train.log
log "multi-turn"
BUDGET=200 LIMIT_MIN=1.8 MULTI_TIMEOUT=125 bash tools/gpu/gpu_multi_turn.sh B 2>&1 | tail -22
log "LoRA B"
LIMIT_MIN=1.8 TRAIN_TIMEOUT=130 bash tools/gpu/gpu_lora.sh B 2>&1 | tail -22
log "done"
