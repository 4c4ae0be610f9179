#!/usr/bin/env bash
# The merged main on one H200, two device calls on the same warm machine (SGLang's wheels come in two parts):
#   part1: GPU tests (graphed/compiled native decode, decode layer, packed kernels, fused kernels), then the
#          issue-8 GRPO step with rollout.engine=native, inductor's exact bf16 casts on and off (mismatch A/B)
#   part2: the GRPO step with rollout.engine=sglang (engine contract, bucketed refresh through FullWeights)
# Wheel folders as in gpu_grpo_step.sh (MCORE, SGL1, SGL2), e.g. with the re-split wheels of 2026-12-01:
#   run(carry=[".gpu-speed-w1"]): MCORE=.gpu-speed-w1/mcore SGL1=.gpu-speed-w1 bash tools/gpu/gpu_check_main.sh part1
#   run(carry=[".gpu-speed-w2"]): SGL2=.gpu-speed-w2 bash tools/gpu/gpu_check_main.sh part2
set -uo pipefail
PART=${1:?part1|part2}
MCORE=${MCORE:-.whl}
SGL1=${SGL1:-.carry/part1}
source tools/gpu/gpu_env.sh
bench() { local name=$1; shift; echo "=== $name ($(date +%T))"
  timeout 300 python3 -m tools.bench.bench_grpo_step "$@" 2>&1 | grep -Ev "rollout: +[0-9]+%" | tee "$OUT/$name.log" | tail -6; }
if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site && install "$MCORE"/megatron_core*.whl "$SGL1"/*.whl || exit 3
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "=== GPU tests ($(date +%T))"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/unit/rollout/test_static_decode.py \
      tests/unit/rollout/test_decode_layer.py tests/unit/models/test_packing.py tests/unit/kernels 2>&1 | tail -6
  bench native --engine native --steps 2 --out "$OUT"
  bench native_inexact_casts --engine native --exact-casts 0 --steps 1 --standalone 0 --out "$OUT/variants/inexact"
  exit 0
fi
sglang_part part2
bench sglang --engine sglang --attention-backend flashinfer --steps 2 --out "$OUT"
