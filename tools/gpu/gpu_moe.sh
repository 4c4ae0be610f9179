#!/usr/bin/env bash
# Issue 24 (Qwen3 dense + MoE) on one H200, part A only: random weights, bf16, at most 195 s in all (every command
# under `timeout`, each within what is left). After gpu_env.sh has installed megatron-core into /tmp/site:
#   bash tools/gpu/gpu_moe.sh A
# 1. tools.bench.bench_moe_step: a Qwen3-30B-A3B-shaped MoE (hidden 2048, 128 experts top-8, moe_intermediate 768)
#    cut to the layers that fit one H200 by estimate, log-prob + update phases of a GRPO step with megatron's
#    SequentialMLP and the grouped experts (torch._grouped_mm) on the same weights: MFU of active-parameter FLOPs,
#    peak memory; plus a 2-layer model, so the largest MoE that trains with the distributed optimizer is stated
#    from a line through two measured peaks;
# 2. the Qwen3-0.6B dense shape against Qwen2.5-0.5B's on the same tokens;
# 3. tools.bench.bench_rollout: native-engine eager decode tokens/s of the MoE cut to ROLL_LAYERS (4) layers, per
#    expert implementation (random weights drawn on the GPU: bench_moe_step.build_fast);
# 4. the MoE GPU tests (tests/unit/models: grouped_mm vs the loop, bf16 model vs fp32, eager MoE decode).
# Everything under $OUT/moe/ (JSON per command, logs, summary.json); the table at the end (tools.bench.moe_table).
# CPU dry run (tiny shapes, local venv): DRY=1 OUT=/tmp/dry_moe PY=.venv/bin/python bash tools/gpu/gpu_moe.sh A
set -uo pipefail
PART=${1:?A}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
[[ -n "${DRY:-}" ]] || export PYTHONPATH=/tmp/site:$PWD
log() { echo "=== $* ($(date +%T))"; }
if [[ $PART != A ]]; then echo "gpu_moe.sh: part A only (random weights); nothing to do for part $PART"; exit 0; fi
if [[ -z "${DRY:-}" && ! -d /tmp/site/megatron ]]; then echo "COLD_MACHINE: install megatron-core first"; exit 9; fi
D=$OUT/moe
mkdir -p "$D"
: > "$D/rc.txt"
# the dry run is slower: tiny sizes on two shared CPU cores
BUDGET=${BUDGET:-$([[ -n "${DRY:-}" ]] && echo 900 || echo 195)}
END=$((SECONDS + BUDGET))

run_step() {  # run_step NAME MAX_SECONDS CMD...: CMD under timeout (its max, or what is left); log to $D/NAME.log
  local name=$1 want=$2 left=$((END - SECONDS - 3))
  shift 2
  local t=$((want < left ? want : left))
  if ((t < 10)); then echo "$name: skipped (out of time)" | tee -a "$D/rc.txt"; return; fi
  log "$name (at most ${t}s)"
  timeout -k 5 "$t" "$@" > "$D/$name.log" 2>&1
  local rc=$?
  grep -v "Warning\|warnings.warn" "$D/$name.log" | tail -n "${TAIL:-4}"
  echo "$name: rc $rc$([[ $rc == 124 || $rc == 137 ]] && echo " (timed out at ${t}s)")" | tee -a "$D/rc.txt"
}

if [[ -n "${DRY:-}" ]]; then
  STEP=(--tiny) ROLL=(--dtype fp32 --batch 4 --prompt-len 8 --new-tokens 4 --repeat 1) SHAPE=TINY ROLL_LAYERS=2
else
  STEP=(--sequences 8 --seq-len 2048 --micro-batch 4 --steps ${STEPS:-1} --warmup 1)
  ROLL=(--dtype bf16 --batch 64 --prompt-len 128 --new-tokens 32 --repeat 1) SHAPE=MOE ROLL_LAYERS=${ROLL_LAYERS:-4}
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

run_step moe_step 85 $PY -m tools.bench.bench_moe_step "${STEP[@]}" --dense 0 --out "$D/step"
cp "$D"/step/moe_step*.json "$D/moe_step.json" 2>/dev/null
TAIL=3 run_step dense 20 $PY -m tools.bench.bench_moe_step "${STEP[@]}" --moe 0 --out "$D/dense_run"
cp "$D"/dense_run/moe_step*.json "$D/dense.json" 2>/dev/null

HF=$D/hf_moe_${ROLL_LAYERS}l  # the MoE's config.json only: bench_rollout builds random weights from it
$PY -c "import json, os, sys; from tools.bench.bench_moe_step import MOE, TINY
cfg = {**MOE, **(TINY if sys.argv[1] == 'TINY' else {}), 'num_hidden_layers': int(sys.argv[2])}
os.makedirs(sys.argv[3], exist_ok=True); json.dump(cfg, open(os.path.join(sys.argv[3], 'config.json'), 'w'))" \
  $SHAPE $ROLL_LAYERS "$HF"
for impl in grouped sequential; do
  TAIL=3 run_step "rollout_$impl" 30 $PY -m tools.bench.bench_rollout --hf-path "$HF" --moe-expert-impl $impl \
      "${ROLL[@]}" --out "$D"
done
TAIL=6 run_step gpu_tests 30 $PY -m pytest -q -x -p no:cacheprovider tests/unit/models/test_moe_gpu.py \
    tests/unit/models/test_experts_grouped.py -m gpu -s
log "summary"
$PY -m tools.bench.moe_table "$D" | tee "$D/table.txt"
