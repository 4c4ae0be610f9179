#!/usr/bin/env bash
# Issue 27, the small-model trainer phases on one GPU: the real SmolLM2-135M-Instruct / GSM8K job
# (configs/gsm8k_grpo_smollm2.yaml, 64 prompts x 8) profiled per phase (trainer.profile_steps: wall, GPU busy,
# kernel launches, host syncs) for a list of settings, back to back on one warm machine. Two calls, because a
# call carries at most 64 MiB and the GGUF is 98 MB (split in two halves under gguf/, see gpu_learning.sh):
#   WHL=.gpu-w/mcore bash tools/gpu/gpu_small_speed.sh part1    # carry .gpu-w and gguf (its part1 half)
#   bash tools/gpu/gpu_small_speed.sh part2 [VARIANT...]        # same warm machine; carry gguf
# VARIANT = name:override,override,... ("base:" = the preset as is). Results under $OUT/<name>/: the run's log,
# metrics.jsonl and profile/step_<N>.{json,txt}; $OUT/summary.txt has every variant's per-phase table.
# CPU dry run of part2 (the local venv, tiny sizes): DRY=1 OUT=/tmp/dry PY=.venv/bin/python bash tools/gpu/gpu_small_speed.sh part2
set -uo pipefail
PART=${1:?part1|part2}
shift
PY=${PY:-python3}
STEPS=${STEPS:-5}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T))"; }

if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${WHL:?wheel folder}"/*.whl || exit 3
  cp gguf/smollm2.gguf.part1 /tmp/ || exit 4
  nvidia-smi -L; $PY -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)"
  exit 0
fi

mkdir -p "$OUT"
W=/tmp/small_speed
if [[ -n "${DRY:-}" ]]; then
  GGUF=$($PY -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  SIZES=(--max-train 64 --max-test 4)
  EXTRA=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=8
         actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 reward.num_workers=1)
  STEPS=2
else
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part1 first"; exit 9; }
  GGUF=/tmp/smollm2.gguf
  [[ -f $GGUF ]] || cat /tmp/smollm2.gguf.part1 gguf/smollm2.gguf.part2 > $GGUF || exit 4
  SIZES=()
  EXTRA=()
fi
if [[ ! -d $W/mcore ]]; then
  log "SmolLM2-135M-Instruct: GGUF -> HF -> megatron; GSM8K"
  $PY -m tools.gguf_to_hf --gguf $GGUF --out $W/hf --dtype bf16 --overwrite 2>&1 | tail -1
  $PY -m tools.convert_checkpoint hf-to-mcore --hf-dir $W/hf --out $W/mcore --dtype bf16 2>&1 | tail -1
  $PY -m tools.prepare_gsm8k --output-dir $W/gsm8k "${SIZES[@]}" | tail -1 || exit 5
fi
[[ $# -gt 0 ]] || set -- "base:"
for variant in "$@"; do
  name=${variant%%:*}
  IFS=, read -r -a overrides <<< "${variant#*:}"
  log "variant $name: ${overrides[*]:-(preset)}"
  rm -rf $W/run_$name
  $PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.hf_path=$W/hf model.load=$W/mcore \
      data.train_files=$W/gsm8k/train.parquet data.val_files=$W/gsm8k/test.parquet trainer.output_dir=$W/run_$name \
      trainer.total_steps=$STEPS trainer.profile_steps=[$STEPS] trainer.test_freq=0 trainer.save_freq=0 \
      trainer.export_hf=false trainer.resume=disable trainer.logger=[console,jsonl] "${EXTRA[@]}" "${overrides[@]}" \
      2>&1 | grep -v "Warning\|warnings.warn" > $OUT/$name.log
  echo "rc ${PIPESTATUS[0]}"
  mkdir -p $OUT/$name && cp -r $W/run_$name/profile $W/run_$name/metrics.jsonl $OUT/$name/ 2>/dev/null
  { echo "## $name: ${overrides[*]:-(preset)}"; grep "step [0-9]*/" $OUT/$name.log | tail -2
    sed -n '/profile step/,/written to/p' $OUT/$name.log; } | tee -a $OUT/summary.txt
done
