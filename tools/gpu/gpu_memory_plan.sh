#!/usr/bin/env bash
# Issue 42 on one H200: the memory plan's predicted peak per phase (rlhf_mcore.plan.phases) against the measured one
# (perf/max_memory_gb/<phase>: torch.cuda.max_memory_allocated, reset as each phase starts), one GRPO bench run per
# shape (tools/bench/bench_grpo_step.py, random bf16 weights, 64 prompts x 8 x (128 + 256) tokens, 1 warm-up + 2
# steps). One call: carry .gpu-async-w (megatron-core cp312).
#   bash tools/gpu/gpu_memory_plan.sh
# Each variant writes $OUT/<name>.json (its "memory_plan" records); then $OUT/memory_plan.json and a table.
# VARIANTS: "name:bench args;..." (default below). CPU dry run: DRY=1 OUT=/tmp/dry_mem PY=.venv/bin/python bash ...
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
mkdir -p "$OUT"
SHAPES=/tmp/plan_shapes
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
DEFAULT="padded:;packed:--max-tokens 65536 --pack 1;kl_two_minis:--kl-loss 1 --mini-batches 2"
DEFAULT+=";q1.5b:--hf-path $SHAPES/qwen2.5-1.5b --micro-batch 32;q3b:--hf-path $SHAPES/qwen2.5-3b --micro-batch 16"
DEFAULT+=";moe2l:--hf-path $SHAPES/qwen3-30b-a3b-2l --micro-batch 16"
IFS=';' read -r -a RUNS <<< "${VARIANTS:-$DEFAULT}"
names=()
for run in "${RUNS[@]}"; do
  name=${run%%:*}
  read -r -a args <<< "${run#*:}"
  [[ -z "${DRY:-}" ]] || args=(--tiny)
  names+=("$name")
  log "$name: ${args[*]}"
  timeout -k 5 ${RUN_TIMEOUT:-150} $PY -m tools.bench.bench_grpo_step --engine native --steps 2 --warmup 1 \
      --standalone 0 --label "$name" --out $OUT/$name "${args[@]}" 2>&1 | grep -v "Warning\|warnings.warn" \
      | grep -A4 "phase  predicted\|Error\|Traceback" | head -12
done
$PY - "$OUT" "${names[@]}" <<'EOF'
import json, pathlib, sys
out, rows = pathlib.Path(sys.argv[1]), []
for name in sys.argv[2:]:
    for f in sorted((out / name).glob("*.json")):
        result = json.loads(f.read_text())
        rows += [{"variant": name, **r} for r in result.get("memory_plan", [])]
(out / "memory_plan.json").write_text(json.dumps(rows, indent=2))
print("| variant | phase | predicted GiB | measured GiB | predicted / measured |\n|---|---|---|---|---|")
for r in rows:
    m, q = r["measured_gib"], r["ratio"]
    print(f"| {r['variant']} | {r['phase']} | {r['predicted_gib']:.2f} | {'-' if m is None else f'{m:.2f}'} | "
          f"{'-' if q is None else f'{q:.3f}'} |")
EOF
