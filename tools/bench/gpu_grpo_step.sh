#!/usr/bin/env bash
# Issue 8 on one H200, two device calls on the same warm machine (SGLang's wheels come in two parts):
#   part1: carries megatron-core, SGLang wheel part 1 and $TRL (TRL + datasets wheels): GPU tests of the graphed
#          native decoder, our GRPO step with rollout.engine=native (+ A/B variants), TRL's GRPOTrainer
#   part2: carries SGLang wheel part 2: our GRPO step with rollout.engine=sglang (+ the fp32 LM head variant)
# Results land in $OUT; combine them here with python -m tools.bench.bench_grpo_step --combine.
# Wheel folders (relative to the directory the script runs in): MCORE, SGL1, SGL2, TRL. A call carries 64 MiB at
# most, so when the code travels as a copy (a helper's worktree) move tokenizers, openai and pyzmq from SGLang's
# part 1 to part 2, e.g. (2026-12-01, second session; megatron-core in w1/mcore, TRL wheels in w1/trl):
#   run(carry=[".gpu-speed", ".gpu-speed-w1"]): cd .gpu-speed && MCORE=../.gpu-speed-w1/mcore SGL1=../.gpu-speed-w1 \
#       TRL=../.gpu-speed-w1/trl bash tools/bench/gpu_grpo_step.sh part1
#   run(carry=[".gpu-speed", ".gpu-speed-w2"]): cd .gpu-speed && SGL2=../.gpu-speed-w2 bash tools/bench/gpu_grpo_step.sh part2
# TRL's wheels (the box has transformers and accelerate, not trl / datasets / dill / multiprocess), once, here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d <carry dir>/.trlwhl trl==1.16.0 datasets==5.2.0 "dill<0.4.2" "multiprocess<0.70.20"
set -uo pipefail
PART=${1:?part1|part2}
MCORE=${MCORE:-../.whl}
SGL1=${SGL1:-../.carry/part1}
SGL2=${SGL2:-../.carry/part2}
TRL=${TRL:-.trlwhl}
SGL_ATTN=${SGL_ATTN:-flashinfer}
VARIANTS=${VARIANTS:-1}  # part1: A/B runs (eager decode + unfused SwiGLU; micro-batch 64); part2: fp32 LM head
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
install() { local dir=$1; shift; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dir" "$@"; }
bench() { local name=$1; shift; echo "=== $name ($(date +%T))"
  timeout 300 python3 -m tools.bench.bench_grpo_step "$@" 2>&1 | grep -Ev "rollout: +[0-9]+%" | tee "$OUT/$name.log" | tail -8; }
if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site /tmp/trlsite
  install /tmp/site "$MCORE"/megatron_core*.whl "$SGL1"/*.whl || exit 3
  install /tmp/trlsite "$TRL"/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
  echo "=== GPU tests: graphed native decode ($(date +%T))"
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_static_decode.py -m gpu 2>&1 | tail -15
  bench native --engine native --out "$OUT" --profile "$OUT/profile_native.txt" \
      --profile-rollout "$OUT/profile_rollout_native.txt"
  if [[ $VARIANTS == 1 ]]; then
    bench native_eager_decode_unfused_swiglu --engine native --compile-decode 0 --swiglu-fusion 0 --steps 1 \
        --standalone 0 --out "$OUT/variants/eager"
    bench native_micro_batch_64 --engine native --micro-batch 64 --steps 1 --standalone 0 --out "$OUT/variants/mb64"
  fi
  echo "=== TRL ($(date +%T))"
  PYTHONPATH=/tmp/trlsite timeout 300 python3 -m tools.bench.bench_trl_grpo --out "$OUT" 2>&1 | tr '\r' '\n' \
      | grep -v "it/s\|s/it\]" | tee "$OUT/trl.log" | tail -6
  exit 0
fi
[[ -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
install /tmp/site "$SGL2"/*.whl || exit 3
bench sglang --engine sglang --attention-backend "$SGL_ATTN" --out "$OUT"
if [[ $VARIANTS == 1 ]]; then
  bench sglang_fp32_lm_head --engine sglang --attention-backend "$SGL_ATTN" --fp32-lm-head 1 --steps 2 \
      --standalone 0 --out "$OUT/variants/fp32_lm_head"
fi
