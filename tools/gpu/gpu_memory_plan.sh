#!/usr/bin/env bash
# Issue 42 on one H200: the memory plan's predicted peak per phase (rlhf_mcore.plan.phases) against the measured one
# (perf/max_memory_gb/<phase>: torch.cuda.max_memory_allocated, reset as each phase starts), one GRPO bench run per
# variant (tools/bench/bench_grpo_step.py, random bf16 weights, 64 prompts x 8 x (128 + 256) tokens unless the
# variant says otherwise, 1 warm-up + 2 steps, 1 for the 3B and 7B shapes; eager decode steps in CUDA graphs).
# Two calls on one warm machine, each < 560 s (each variant has its own timeout, TIMEOUTS below); carry .gpu-async-w
# (megatron-core cp312) in the first, nothing in the second:
#   GROUP=small bash tools/gpu/gpu_memory_plan.sh   # the 0.5B variants, 1.5B, 3B
#   GROUP=large bash tools/gpu/gpu_memory_plan.sh   # the 2-layer MoE, the two 7B shapes
#   MCORE=.gpu-speed-w1/mcore SGL1=.gpu-speed-w1 GROUP=sglang1 ...   # carry .gpu-speed-w1 (move its trl/ out: 64 MiB)
#   SGL2=.gpu-speed-w2 GROUP=sglang2 ...            # carry .gpu-speed-w2: rollout through SGLang, 0.5B and 1.5B
# (2026-12-04: in one call with 40-85 s timeouts and random weights drawn on the CPU, every shape above 0.5B ran out
# of its time; the shapes above 0.5B now draw their weights on the GPU, --gpu-init 1.)
# Each variant writes $RUNS_DIR/<name>/grpo_step_part_*.json (its "memory_plan" records and "plan_input": the
# resolved config, config.json and measured peaks); $OUT gets memory_plan.json (the rows) and memory_plan_runs.json
# (every result), and a table is printed. Re-predict on a CPU with the plan of the code checked out, against the same
# measurements:  python -m tools.bench.memory_plan_check --repredict OUT/memory_plan_runs.json --out table.json
# VARIANTS: "name:bench args;..." (default below). CPU dry run (each variant's --set overrides on the tiny model):
#   DRY=1 OUT=/tmp/dry_mem PY=.venv/bin/python bash tools/gpu/gpu_memory_plan.sh
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
mkdir -p "$OUT"
SHAPES=/tmp/plan_shapes
RUNS_DIR=${RUNS_DIR:-/tmp/memory_plan_runs}  # per-variant results; $OUT gets two files
if [[ ${GROUP:-} == sglang1 || ${GROUP:-} == sglang2 ]]; then  # SGLang's two-call install (tools/gpu/gpu_env.sh)
  source tools/gpu/gpu_env.sh
  sglang_part "part${GROUP#sglang}"  # part1 installs and exits
fi
if [[ -z "${DRY:-}" ]]; then
  export PYTHONPATH=/tmp/site:$PWD
  [[ -d /tmp/site/megatron ]] || { mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site .gpu-async-w/*.whl || exit 3; }
fi
$PY - "$SHAPES" <<'EOF'
import json, os, sys
qwen = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, tie_word_embeddings=True,
            max_position_embeddings=32768, rope_theta=1000000.0)
shapes = {
    "qwen2.5-1.5b": dict(qwen, num_hidden_layers=28, hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                         num_key_value_heads=2),
    "qwen2.5-3b": dict(qwen, num_hidden_layers=36, hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
                       num_key_value_heads=2),
    "qwen2.5-7b": dict(qwen, num_hidden_layers=28, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "qwen3-30b-a3b-2l": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_hidden_layers=2,
                             hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                             num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
                             head_dim=128, vocab_size=151936, max_position_embeddings=40960, decoder_sparse_step=1,
                             mlp_only_layers=[]),
}
for name, hf in shapes.items():
    os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
    json.dump(hf, open(os.path.join(sys.argv[1], name, "config.json"), "w"))
EOF
SMALL="--prompts 16 --n 4 --steps 1 --gpu-init 1"  # the 7B shapes: 64 rows a step
LORA="--set model.lora_rank=32 --set model.lora_alpha=32 --set model.target_modules=all-linear"
DEFAULT="padded:;packed:--max-tokens 65536 --pack 1;kl_two_minis:--kl-loss 1 --mini-batches 2"
DEFAULT+=";ppo_critic:--set algorithm.adv_estimator=gae --mini-batches 2"
DEFAULT+=";q1.5b:--hf-path $SHAPES/qwen2.5-1.5b --micro-batch 32 --gpu-init 1"
DEFAULT+=";q3b:--hf-path $SHAPES/qwen2.5-3b --micro-batch 16 --steps 1 --gpu-init 1"
LARGE="moe2l:--hf-path $SHAPES/qwen3-30b-a3b-2l --micro-batch 16 --gpu-init 1"
LARGE+=";q7b_lora:--hf-path $SHAPES/qwen2.5-7b $SMALL --micro-batch 8 $LORA"
LARGE+=";q7b_offload:--hf-path $SHAPES/qwen2.5-7b $SMALL --micro-batch 1 --set trainer.offload_during_rollout=true"
LARGE+=" --set rollout.native.keep_graphs=false"  # plan: 133 GiB at the update; the kept KV cache would add 1.3
# rollout through SGLang: its rollout is measured as the device memory in use (perf/device_used_gb/gen), which
# counts the scheduler process's KV pool
SGLANG="sglang_0.5b:--engine sglang;sglang_1.5b:--engine sglang --hf-path $SHAPES/qwen2.5-1.5b --micro-batch 32 --gpu-init 1"
# seconds per variant (expected: 0.5B ~25 s, 1.5B ~35 s, 3B ~45 s, 7B ~60-80 s, start-up and warm-up included)
declare -A TIMEOUTS=([padded]=60 [packed]=60 [kl_two_minis]=60 [ppo_critic]=60 [q1.5b]=120 [q3b]=150 [moe2l]=120
                     [q7b_lora]=180 [q7b_offload]=220 [sglang_0.5b]=200 [sglang_1.5b]=220)  # small 510 s, large 520 s, + the wheel's install
case ${GROUP:-small} in small) PICK=$DEFAULT ;; large) PICK=$LARGE ;; sglang2) PICK=$SGLANG ;;
  *) echo "GROUP: small, large, or sglang1 then sglang2"; exit 2 ;; esac
IFS=';' read -r -a RUNS <<< "${VARIANTS:-$PICK}"
names=()
for run in "${RUNS[@]}"; do
  name=${run%%:*}
  read -r -a args <<< "${run#*:}"
  if [[ -n "${DRY:-}" ]]; then  # the tiny model with the variant's config overrides
    dry=(--tiny)
    for ((i = 0; i < ${#args[@]}; i++)); do
      [[ ${args[i]} == --set ]] && dry+=(--set "${args[i + 1]}")
    done
    args=("${dry[@]}")
  fi
  names+=("$name")
  log "$name: ${args[*]}"
  timeout -k 5 "${TIMEOUTS[$name]:-${RUN_TIMEOUT:-60}}" $PY -m tools.bench.bench_grpo_step --engine native --steps 2 \
      --warmup 1 --compile-decode 0 --standalone 0 --label "$name" --out $RUNS_DIR/$name "${args[@]}" 2>&1 \
      | grep -v "Warning\|warnings.warn" | grep -A8 "phase  predicted\|Error\|Traceback" | head -14
done
$PY - "$OUT" "$RUNS_DIR" "${names[@]}" <<'EOF'
import json, pathlib, sys
out, runs, rows, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), [], []
for name in sys.argv[3:]:
    for f in sorted((runs / name).glob("*.json")):
        result = json.loads(f.read_text())
        results.append(result)
        rows += [{"variant": name, **r} for r in result.get("memory_plan", [])]
(out / "memory_plan.json").write_text(json.dumps(rows, indent=2))
(out / "memory_plan_runs.json").write_text(json.dumps(results, indent=1))  # for memory_plan_check --repredict
print("| variant | phase | predicted GiB | measured GiB | predicted / measured |\n|---|---|---|---|---|")
for r in rows:
    m, q = r["measured_gib"], r["ratio"]
    print(f"| {r['variant']} | {r['phase']} | {r['predicted_gib']:.2f} | {'-' if m is None else f'{m:.2f}'} | "
          f"{'-' if q is None else f'{q:.3f}'} |")
EOF
log "done"
