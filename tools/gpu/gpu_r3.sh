#!/usr/bin/env bash
# Issue 40 on one H200: routing replay R3 (actor.router_replay=R3, the rollout's experts replayed by every trainer
# pass) against R2 (the update replays the old-log-prob pass's) and none, on the 2-layer Qwen3-30B-A3B shape (hidden
# 2048, 128 experts top-8, moe_intermediate 768; random bf16 weights drawn on the GPU) through
# tools/bench/bench_grpo_step.py: one GRPO step = native rollout, old-log-prob pass, update, weight refresh.
# Per arm: the rollout-vs-trainer mismatch the trainer logs (rollout/mismatch_*: the old pass against the sampler's
# log-probs), the update's seconds and MFU (active-expert FLOPs, 790 TFLOP/s peak), the step's seconds.
# The same engine settings in every arm, so only the replay differs:
# - eager decode (--cuda-graphs 0): R3 records on the native engine's eager path only, and the native engine
#   decodes MoE eagerly anyway (its static decoder has no MoE layer), so no arm decodes differently;
# - two mini-batches per step (--mini-batches 2), so the old-log-prob pass runs in every arm (R2 records in it,
#   R3 replays in it, none routes freely) and the mismatch is measured the same way;
# - 32 prompts x 8 samples x (128 + 128) tokens, micro-batch 16, 1 warm-up step + 2 timed steps.
# Native engine, one call, about 4 min (three processes, each under `timeout`, within BUDGET seconds in all); carry
# .gpu-async-w (megatron-core cp312 + gguf wheels):
#   bash tools/gpu/gpu_r3.sh
# SGLang (R3 from its returned routed experts), two calls on one warm machine (its wheels: gpu_env.sh's sglang_part):
#   bash tools/gpu/gpu_r3.sh sglang1   carry .whl .carry/part1: installs megatron-core + SGLang part 1, ends
#   bash tools/gpu/gpu_r3.sh sglang2   carry .carry/part2: part 2, the R3 GPU tests of tests/unit/rollout/
#                                      test_sglang_routing.py, then the arms (ARMS="R3 disabled") with --engine sglang
#                                      (SGLang's own CUDA graphs in both), about 6 min
# $OUT/<arm>/*.json per arm, then $OUT/r3.json and a table. ARMS="R3 R2 disabled" (R3 first: a cut run keeps it).
# CPU dry run (the tiny MoE preset's shape, fp32, --tiny): DRY=1 OUT=/tmp/dry_r3 PY=.venv/bin/python bash tools/gpu/gpu_r3.sh
set -uo pipefail
MODE=${1:-native}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
mkdir -p "$OUT"
ENGINE=native
if [[ $MODE == sglang1 || $MODE == sglang2 ]]; then
  source tools/gpu/gpu_env.sh
  sglang_part "part${MODE#sglang}"  # part1 exits here
  ENGINE=sglang ARMS=${ARMS:-R3 disabled}
  log "GPU tests: R3 through SGLang"
  timeout -k 5 240 $PY -m pytest -q -p no:cacheprovider -m gpu -s tests/unit/rollout/test_sglang_routing.py \
      tests/dist/rollout/test_sglang_r3.py 2>&1 \
      | grep -v "Warning\|warnings.warn" | grep "passed\|failed\|Error\|assert\|{" | tail -12
elif [[ -z "${DRY:-}" ]]; then
  export PYTHONPATH=/tmp/site:$PWD
  [[ -d /tmp/site/megatron ]] || { mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site .gpu-async-w/*.whl || exit 3; }
fi
[[ -n "${DRY:-}" ]] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
BUDGET=${BUDGET:-$([[ -n "${DRY:-}" ]] && echo 900 || ([[ $ENGINE == sglang ]] && echo 300 || echo 270))}
END=$((SECONDS + BUDGET))
HF=$OUT/qwen3-30b-a3b-2l
$PY - "$HF" "${DRY:+tiny}" <<'EOF'
import json, os, sys
from tools.bench.bench_moe_step import MOE
hf = {**MOE, "num_hidden_layers": 2, "decoder_sparse_step": 1, "mlp_only_layers": []}
if sys.argv[2]:  # the tiny MoE preset's shape (data/tiny_moe): seconds on a CPU
    hf = json.load(open("data/tiny_moe/config.json"))
os.makedirs(sys.argv[1], exist_ok=True)
json.dump(hf, open(os.path.join(sys.argv[1], "config.json"), "w"))
EOF
if [[ -n "${DRY:-}" ]]; then
  SHAPE=(--tiny)
else
  SHAPE=(--prompts 32 --n 8 --prompt-len 128 --new-tokens 128 --micro-batch 16 --gpu-init 1)
fi
read -r -a ARM_LIST <<< "${ARMS:-R3 R2 disabled}"
for arm in "${ARM_LIST[@]}"; do
  left=$((END - SECONDS - 5))
  most=${RUN_TIMEOUT:-$([[ $ENGINE == sglang ]] && echo 160 || echo 100)}
  t=$((most < left ? most : left))
  if ((t < 20)); then echo "$arm: skipped (out of time)"; continue; fi
  log "router_replay=$arm, $ENGINE engine (at most ${t}s)"
  timeout -k 5 "$t" $PY -m tools.bench.bench_grpo_step --engine $ENGINE --hf-path "$HF" --router-replay "$arm" \
      --cuda-graphs 0 --mini-batches 2 --steps 2 --warmup 1 --standalone 0 --label "$arm" --out "$OUT/$arm" \
      "${SHAPE[@]}" > "$OUT/$arm.log" 2>&1
  rc=$?
  grep -v "Warning\|warnings.warn" "$OUT/$arm.log" | grep "step [0-9]:\|routing replay\|decoding eagerly\|rollout engine\|Error\|Traceback" \
      | tail -6
  echo "$arm: rc $rc$([[ $rc == 124 || $rc == 137 ]] && echo " (timed out at ${t}s)")"
done
log "summary"
$PY - "$OUT" "${ARM_LIST[@]}" <<'EOF'
import json, pathlib, sys
out, rows = pathlib.Path(sys.argv[1]), {}
for arm in sys.argv[2:]:
    for f in sorted((out / arm).glob("grpo_step_part_*.json")):
        rows[arm] = json.loads(f.read_text())
(out / "r3.json").write_text(json.dumps(rows, indent=2))
print("| router_replay | mismatch logp abs diff | mismatch KL k3 | exact frac | gen s | old log-prob s | update s "
      "| update MFU | step s | peak GiB |\n|---|---|---|---|---|---|---|---|---|---|")
fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
for arm, r in rows.items():
    m, ph = r["mismatch"], r["phases_s"]
    print(f"| {arm} | {fmt(m['rollout/mismatch_logp_abs_diff'], '.5f')} | {fmt(m['rollout/mismatch_kl_k3'], '.2e')} | "
          f"{fmt(m['rollout/mismatch_exact_frac'], '.3f')} | {ph['gen']:.2f} | {ph['old_log_prob']:.2f} | "
          f"{ph['update_actor']:.2f} | {r['update_mfu']:.1%} | {r['step_s']:.2f} | {fmt(r['peak_mem_gib'], '.1f')} |")
missing = [a for a in sys.argv[2:] if a not in rows]
print(f"arms without a result: {missing}" if missing else f"wrote {out / 'r3.json'}")
EOF
