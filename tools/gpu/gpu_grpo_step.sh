#!/usr/bin/env bash
# Issue 8's table on one H200, back to back on ONE machine in two device calls (SGLang's wheels come in two
# parts and a call carries 64 MiB; the second call must come within the box's 30 s idle window):
#   part1: carries megatron-core (W1/mcore), TRL's wheels (W1/trl) and SGLang part 1 (W1/*.whl); the GPU tests;
#          our GRPO step with rollout.engine=native at the default decode attention (auto: the probe's choice)
#          and with decode_attention=triton (and =sdpa when auto took triton); TRL's GRPOTrainer; results are
#          also kept in /tmp/b2b on the machine for part2
#   part2: carries SGLang part 2 (W2); the SGLang engine's GPU test; our GRPO step with rollout.engine=sglang
#          (flashinfer; its standalone A/B rows: prompts prefilled once or per row, weight refresh in flat
#          buckets or tensor by tensor, no log-probs); then the merged table of all systems ->
#          $OUT/grpo_step_b2b.json (speed-ups against TRL's step)
# Wheel folders, once, from the repository root here (2026-12-01, sixth session):
#   bash tools/gpu/fetch_gpu_wheels.sh .gpu-speed-w1 .gpu-speed-w2
#   run(carry=[".gpu-speed-w1"]): W1=.gpu-speed-w1 bash tools/gpu/gpu_grpo_step.sh part1
#   run(carry=[".gpu-speed-w2"]): W2=.gpu-speed-w2 bash tools/gpu/gpu_grpo_step.sh part2
# Switches: TESTS=0 (no GPU tests), STEPS (timed steps, 3), ALT=0 (part1: the default native run only, no TRL).
# CPU dry run of the benchmark calls (tiny model): DRY=1 OUT=/tmp/dry bash tools/gpu/gpu_grpo_step.sh part1
set -uo pipefail
PART=${1:?part1|part2}
MCORE=${W1:-}/mcore SGL1=${W1:-} SGL2=${W2:-}
source tools/gpu/gpu_env.sh
KEEP=/tmp/b2b
EXTRA=()
if [[ -n ${DRY:-} ]]; then export PATH=$PWD/.venv/bin:$PATH; EXTRA=(--tiny); KEEP=$OUT/keep; fi

bench() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T))"
  timeout "$limit" python3 -m tools.bench.bench_grpo_step "${EXTRA[@]}" "$@" --out "$KEEP" 2>&1 \
      | grep -Ev "rollout: +[0-9]+%" | tee "$OUT/$name.log" | grep -E "step [0-9]|standalone|attention:|ours-|rror" \
      | cut -c1-220; }

mkdir -p "$OUT" "$KEEP"
case $PART in
part1)
  if [[ -z ${DRY:-} ]]; then
    mkdir -p /tmp/site /tmp/trlsite
    install "$MCORE"/megatron_core*.whl "$SGL1"/*.whl || exit 3
    TARGET=/tmp/trlsite install "$W1"/trl/*.whl || exit 4
    nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
  fi
  if [[ -z ${DRY:-} && ${TESTS:-1} == 1 ]]; then
    echo "=== GPU tests ($(date +%T))"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/unit/kernels \
        tests/unit/rollout/test_static_decode.py tests/unit/rollout/test_decode_layer.py tests/unit/rollout/test_logprob_agreement.py \
        2>&1 | tail -6
  fi
  bench native 170 --engine native --steps "${STEPS:-3}"
  [[ ${ALT:-1} == 1 ]] || { cp "$KEEP"/grpo_step_part_*.json "$OUT"/; exit 0; }
  auto=$(python3 -c "import json, glob; print(json.load(open(sorted(glob.glob('$KEEP/grpo_step_part_native*.json'))[0]))
      ['config']['decode_attention'])")  # the default run's file sorts first (native.json, native_tiny.json)
  other=$([[ $auto == sdpa ]] && echo triton || echo sdpa)
  bench "native_$other" 150 --engine native --decode-attention "$other" --steps "${STEPS:-3}" --label "$other"
  if [[ -z ${DRY:-} ]]; then
    echo "=== TRL ($(date +%T))"
    PYTHONPATH=/tmp/trlsite timeout 220 python3 -m tools.bench.bench_trl_grpo --out "$KEEP" 2>&1 | tr '\r' '\n' \
        | grep -v "it/s\|s/it\]" | tee "$OUT/trl.log" | tail -4
  fi
  cp "$KEEP"/grpo_step_part_*.json "$OUT"/ ;;
part2)
  if [[ -z ${DRY:-} ]]; then sglang_part part2; fi
  if [[ -z ${DRY:-} && ${TESTS:-1} == 1 ]]; then
    echo "=== GPU test: SGLang engine vs the trainer, weight refresh in flat buckets ($(date +%T))"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/unit/rollout/test_sglang_engine.py \
        2>&1 | tee "$OUT/sglang_gpu_test.log" | grep -E "passed|failed|rror" | tail -4
  fi
  bench sglang 400 --engine sglang --attention-backend flashinfer --steps "${STEPS:-3}"
  cp "$KEEP"/grpo_step_part_sglang*.json "$OUT"/ 2>/dev/null
  python3 -m tools.bench.bench_grpo_step --combine "$KEEP" --out "$OUT" --combined-name grpo_step_b2b.json ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
