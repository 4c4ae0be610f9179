#!/usr/bin/env bash
# Issue 8 on one H200, two device calls on the same warm machine (SGLang's wheels come in two parts):
#   part1: carries ../.whl (megatron-core), ../.carry/part1 and $TRL (TRL + datasets wheels):
#          GPU tests of the graphed native decoder, our GRPO step with rollout.engine=native, TRL's GRPOTrainer
#   part2: carries ../.carry/part2: our GRPO step with rollout.engine=sglang
# Results land in $OUT; combine them here with bench_grpo_step.py --combine.
# TRL's wheels (the box has transformers and accelerate, not trl / datasets / dill / multiprocess), once, here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d <carry dir>/.trlwhl trl==1.16.0 datasets==5.2.0 "dill<0.4.2" "multiprocess<0.70.20"
set -uo pipefail
PART=${1:?part1|part2}
TRL=${TRL:-.trlwhl}
SGL_ATTN=${SGL_ATTN:-flashinfer}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
install() { local dir=$1; shift; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dir" "$@"; }
if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site /tmp/trlsite
  install /tmp/site ../.whl/megatron_core*.whl ../.carry/part1/*.whl || exit 3
  install /tmp/trlsite "$TRL"/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
  echo "=== GPU tests: graphed native decode ($(date +%T))"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_static_decode.py -m gpu -x 2>&1 | tail -15
  echo "=== ours, native ($(date +%T))"
  timeout 240 python3 -m tools.bench.bench_grpo_step --engine native --out "$OUT" --profile "$OUT/profile_native.txt" \
      2>&1 | grep -v "rollout:" | tee "$OUT/native.log" | tail -25
  echo "=== TRL ($(date +%T))"
  PYTHONPATH=/tmp/trlsite timeout 300 python3 -m tools.bench.bench_trl_grpo --out "$OUT" 2>&1 | tr '\r' '\n' \
      | grep -v "it/s\|s/it\]" | tee "$OUT/trl.log" | tail -6
  exit 0
fi
[[ -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
install /tmp/site ../.carry/part2/*.whl || exit 3
echo "=== ours, sglang ($SGL_ATTN attention) ($(date +%T))"
timeout 420 python3 -m tools.bench.bench_grpo_step --engine sglang --attention-backend "$SGL_ATTN" --out "$OUT" \
    2>&1 | grep -v "rollout:" | tee "$OUT/sglang.log" | tail -25
